"""Which real log sample (tests/data/logs/) names which signature from its log lines alone.

Shared by the log-verdict unit tests and the `replay` end-to-end tests, so the expectation
lives in one place.
"""

from __future__ import annotations

NAMED: dict[str, str] = {
    "b_kserve4657_nvcc_not_found.log": "jit_toolchain_missing",
    "b_vllm23176_ninja_build_failed.log": "jit_toolchain_missing",
    "c_nccl1029_nvls_init_error_multinode.log": "nvls_multicast_failure",
    "c_pt177472_nvls_bind_cuda401.log": "nvls_multicast_failure",
    "c_qwen3vl2018_symm_mem_rendezvous_state.log": "nvls_multicast_failure",
    "d_vllm5458_nccl_watchdog_timeout.log": "collective_hang",
    "d_vllm2734_ray_stall_then_nccl_watchdog.log": "collective_hang",
    "d_vllm48752_throughput_zero_then_shm_broadcast.log": "collective_hang",
    "e_vllm41647_apiserver_enginedeaderror.log": "engine_dead",
    "e_ascend5117_compose_prefix_enginedeaderror.log": "engine_dead",
    "e_1cat539_worker_died_engine_failed_to_start.log": "engine_dead",
}
