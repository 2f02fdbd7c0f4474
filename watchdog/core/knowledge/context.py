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
# (core/judge/rootcause.py setup_stage) tells an error before Init COMPLETE (set-up) from one
# after it (a collective) by them.
NCCL_SETUP_PROGRESS = (
    r"NCCL INFO (?:Bootstrap ?:|cudaDriverVersion \d|ncclCommInitRank\w* comm"
    r"|.*\bcomm 0x[0-9a-f]+ rank \d+ nranks \d+ .*- Init (?:START|COMPLETE))"
)

CONTEXT_PATTERNS: tuple[str, ...] = (NCCL_SETUP_PROGRESS,)
