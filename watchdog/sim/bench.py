"""Bench mode: the `vllm bench throughput` CLI side, with LLM.generate's tqdm bar.

`Processed prompts` bar on stderr, redrawn with `\\r` only when a prompt finishes (so a hung
engine leaves it frozen; vllm/entrypoints/llm.py LLM._run_engine), then vLLM's final lines on stdout
(vllm/benchmarks/throughput.py: `Throughput: ... requests/s, ... total tokens/s, ... output
tokens/s` and `Total num prompt tokens:  N` / `Total num output tokens:  N`).
"""

from __future__ import annotations

import time

from watchdog.sim.config import SimConfig
from watchdog.sim.link import EngineLink
from watchdog.sim.output import Bar, Console, format_meter

DESC = "Processed prompts"
# What the offline CLI prints when its engine dies (the exception line as in the e_* samples).
DEAD_LINE = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


def postfix(prompt_tokens: int, gen_tokens: int, elapsed: float) -> str:
    """LLM._run_engine's postfix: `est. speed input: %.2f toks/s, output: %.2f toks/s`."""
    inp = prompt_tokens / elapsed if elapsed > 0 else 0.0
    out = gen_tokens / elapsed if elapsed > 0 else 0.0
    return f"est. speed input: {inp:.2f} toks/s, output: {out:.2f} toks/s"


def print_throughput(console: Console, total: int, p_tok: int, g_tok: int, elapsed: float) -> None:
    """The final lines of vllm/benchmarks/throughput.py (stdout)."""
    console.line(
        f"Throughput: {total / elapsed:.2f} requests/s, "
        f"{(p_tok + g_tok) / elapsed:.2f} total tokens/s, "
        f"{g_tok / elapsed:.2f} output tokens/s"
    )
    console.line(f"Total num prompt tokens:  {p_tok}")
    console.line(f"Total num output tokens:  {g_tok}")


def run_bench(cfg: SimConfig, console: Console, link: EngineLink) -> int:
    """Drive the bars from the engine's reports; 0 when all prompts finished, 1 if it died."""
    if not link.wait_for("ready"):
        console.line(DEAD_LINE, "err")
        return 1
    total = cfg.num_prompts
    adding = Bar(console, "err")
    t_add = time.monotonic()
    adding.draw(format_meter(0, total, 0.0, "Adding requests"))
    adding.draw(format_meter(total, total, max(time.monotonic() - t_add, 1e-3), "Adding requests"))
    adding.close()
    bar = Bar(console, "err")
    start = time.monotonic()
    bar.draw(format_meter(0, total, 0.0, DESC, postfix(0, 0, 0.0)))
    shown = 0
    while True:
        with link.changed:

            def moved(shown: int = shown) -> bool:
                return link.state.done != shown or link.state.finished or link.state.dead

            link.changed.wait_for(moved, 1.0)
            st = link.state
            done, p_tok, g_tok = st.done, st.prompt_tokens, st.gen_tokens
            finished, dead = st.finished, st.dead
        elapsed = time.monotonic() - start
        if done != shown:
            shown = done
            bar.draw(format_meter(done, total, elapsed, DESC, postfix(p_tok, g_tok, elapsed)))
        if finished:
            bar.close()
            print_throughput(console, total, p_tok, g_tok, elapsed)
            return 0
        if dead:
            bar.close()
            console.line(DEAD_LINE, "err")
            return 1
