"""Lines no rule alarms on that the root-cause readers read beside an error (pure data).

The log source keeps only lines some rule can match (SignatureSet.log_keep_pattern); the readers
under a verdict also need a few lines that say where the server was when an error came. Each is
kept as a plain event and names nothing by itself.
"""

from __future__ import annotations

# NCCL's own progress through communicator set-up, at NCCL_DEBUG=INFO (NVIDIA/nccl src/init.cc
# and src/bootstrap.cc, 2.18-2.27): `NCCL INFO Bootstrap : Using eth0:...` (bootstrapNetInit),
# `NCCL INFO cudaDriverVersion N` (ncclInit), `... comm 0x.. rank R nranks N ... - Init START`
# and `- Init COMPLETE`, and `NCCL INFO ncclCommInitRank comm ...`. The set-up reader
# (core/judge/setupcause.py setup_stage) tells an error before Init COMPLETE (set-up) from one
# after it (a collective) by them.
NCCL_SETUP_PROGRESS = (
    r"NCCL INFO (?:Bootstrap ?:|cudaDriverVersion \d|ncclCommInitRank\w* comm"
    r"|.*\bcomm 0x[0-9a-f]+ rank \d+ nranks \d+ .*- Init (?:START|COMPLETE))"
)

# NCCL's proxy thread answering a connection's set-up messages (src/proxy.cc proxyProgressAsync
# and proxyServiceInitOp, NCCL_DEBUG_SUBSYS=PROXY): `Received and initiated operation=Init
# res=0`, `operation=Setup`, `operation=Connect`: a transport being set up, not yet in use.
NCCL_PROXY_SETUP = r"NCCL INFO Received and initiated operation=(?:Init|Setup|Connect) res="

# A traceback frame of a process's start-up: a constructor, vLLM's worker init_device and
# from_engine_args, torch's init_process_group and vLLM's parallel-state set-up. An error under
# one came before the process was serving (core/judge/setupcause.py reads them as stage init).
STARTUP_FRAME = (
    r'File "[^"]*", line \d+, in (?:__init__|init_device|from_engine_args|init_process_group'
    r"|initialize_model_parallel|init_distributed_environment)\s*$"
)

CONTEXT_PATTERNS: tuple[str, ...] = (NCCL_SETUP_PROGRESS, NCCL_PROXY_SETUP, STARTUP_FRAME)
