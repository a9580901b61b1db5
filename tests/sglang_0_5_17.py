"""Facts of SGLang 0.5.17 that more than one conformance test holds the simulator to (seen on the real engine:
tests/data/h200-sglang-0.5.17-run and tests/data/sglang-0.5.17-recorded)."""

# /server_info keys of 0.5.17 the simulator (which imitates 0.5.23's ServerArgs) does not have: 0.5.17 arguments
# renamed or removed by 0.5.23; rig reads none of them. The same set on the H200 run and the H100 recording.
REAL_ONLY_INFO_KEYS = {
    "cuda_graph_tc_compiler",
    "custom_sigquit_handler",
    "dsa_prefill_cp_mode",
    "elastic_ep_rejoin",
    "enable_dsa_prefill_context_parallel",
    "enable_expert_distribution_metrics",
    "enable_prefill_context_parallel",
    "keep_mm_feature_on_device",
    "kv_events",
    "prefill_cp_mode",
    "speculative_skip_dp_mlp_sync",
    "stat_loggers",
    "torchao_config",
    "uses_mamba_radix_cache",
}
