"""SGLang's side of the simulator: its startup lines, batch lines, metric names, /health and
crash lines, copied from sglang 0.5.23 (paths under python/sglang/ in sgl-project/sglang)."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from watchdog.sim.output import Bar, format_meter
from watchdog.sim.startup import CAPTURE_SIZES, Startup

# srt/managers/scheduler.py run_scheduler_process: "Scheduler hit an exception: {traceback}"
SCHEDULER_TRACE = (
    "Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", '
    "line 6360, in run_scheduler_process",
    "    scheduler.event_loop_overlap()",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
)
# srt/managers/tokenizer_manager.py: the launcher's SIGQUIT handler
SIGQUIT_LINE = "SIGQUIT received. signum=None, frame=None. It usually means one child failed."


class SglangStartup(Startup):
    """Load weight begin/end, the shard bar, CUDA-graph capture, as SGLang prints them."""

    def run(self) -> None:
        """srt/model_executor/model_runner.py load_model, cuda_graph_setup.py capture."""
        self.log("model_runner.py:1274", "Load weight begin. avail mem=78.12 GB")
        took = self.shard_bar()
        self.log(
            "model_runner.py:1373",
            f"Load weight end. elapsed={took:.2f} s, type=LlamaForCausalLM, avail mem=62.10 GB, "
            "mem usage=16.02 GB.",
        )
        self.capture()

    def capture(self) -> None:
        """`Capture target decode CUDA graph begin/end` around tqdm's `Capturing batches` bar."""
        self.log(
            "cuda_graph_setup.py:758",
            "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
            "avail mem=20.25 GB",
        )
        bar = Bar(self._con, "err")
        step = self._cfg.startup_s * 0.5 / CAPTURE_SIZES
        start = self._clock()
        for n in range(0, CAPTURE_SIZES + 1):
            if n:
                self._sleep(step)
            bs = max(1, 512 - n * 7)
            desc = f"Capturing batches (bs={bs} avail_mem=20.{25 - n % 20:02d} GB)"
            bar.draw(format_meter(n, CAPTURE_SIZES, self._clock() - start, desc))
        bar.close()
        self.log(
            "cuda_graph_setup.py:785",
            f"Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed="
            f"{self._clock() - start:.2f} s, mem usage=0.50 GB, avail mem=19.75 GB.",
        )


def decode_line(running: int, waiting: int, gen_tps: float, tokens: int) -> str:
    """metrics_reporter.py report_decode_stats (sglang 0.5.23, no spec decoding, TP=1)."""
    return (
        f"Decode batch, #running-req: {running}, #token: {tokens}, "
        f"token usage: {min(tokens / 251920, 1.0):.2f}, cuda graph: True, "
        f"gen throughput (token/s): {gen_tps:.2f}, #queue-req: {waiting}"
    )


def health_failed_line(timeout_s: float, tic: float, last: float) -> str:
    """srt/entrypoints/http_server.py health_generate after SGLANG_HEALTH_CHECK_TIMEOUT."""
    return (
        "Health check failed. Server couldn't get a response from detokenizer for last "
        f"{timeout_s:g} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}"
        f". last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(last))}"
    )


class SglangCollector:
    """srt/observability/metrics_collector.py names and labels, fresh on every scrape."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def collect(self) -> Any:
        """prometheus_client Collector protocol."""
        st = self._api.link.state
        labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
        values = [self._api.cfg.model, "unified", "0", "0"]
        # The scheduler gauges are written when a batch line is reported: frozen in a hang.
        gauges = (
            ("sglang:num_running_reqs", "The number of running requests.", st.batch_running),
            (
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                st.batch_waiting,
            ),
            ("sglang:gen_throughput", "The generation throughput (token/s).", self._api.gen_tps),
            ("sglang:token_usage", "The token usage.", min(st.batch_running / 64, 1.0)),
        )
        families: list[Any] = []
        for name, doc, value in gauges:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            families.append(fam)
        tok_labels, tok_values = ["model_name"], [self._api.cfg.model]
        for name, doc, value in (
            ("sglang:prompt_tokens", "Number of prefill tokens processed.", st.prompt_tokens),
            ("sglang:generation_tokens", "Number of generation tokens processed.", st.gen_tokens),
            ("sglang:num_requests", "Number of requests processed.", st.done),
        ):
            counter = CounterMetricFamily(name, doc, labels=tok_labels)
            counter.add_metric(tok_values, value)
            families.append(counter)
        return families
