"""SGLang's argument resolution past the speculative settings: what --enable-deterministic-inference changes, and the
launch refusals of the resolution hooks that the simulated system (a hybrid-Mamba Qwen3.5 on CUDA) reaches.

Each rule cites the file and function of SGLang 0.5.23's wheel (paths under ``sglang/srt/``) it comes from;
tests/unit/test_sim_resolution.py checks the rules against that source and runs SGLang's own functions on the same flags
(scripts/sglang_refusals.py over the pinned wheel).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

# The simulated GPU: RTX PRO 6000 Blackwell (compute capability 12.0), the reference system's card. SGLang picks the
# deterministic attention backend by architecture (arg_groups/overrides.py::_deterministic_attention_backend).
GPU_ARCH = "sm120"
BLACKWELL = ("sm100", "sm120")
MODEL_ARCH = "Qwen3_5MoeForConditionalGeneration"  # a hybrid (GDN/Mamba) model: the mamba radix-cache rules apply
# arg_groups/choices.py
DETERMINISTIC_ATTENTION_BACKEND_CHOICES = ("ascend", "fa3", "fa4", "flashinfer", "intel_xpu", "triton")
RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND = ("ascend", "fa3", "fa4", "triton")


@dataclass(frozen=True)
class Refusal:
    """One assertion or ValueError of SGLang's resolution, as a condition on the parsed flags.

    ``message`` is SGLang's text, its f-string fields as ``{name}`` (filled from the flags, plus ``choices``); an
    empty message is a bare ``assert``."""

    file: str
    function: str
    message: str
    refuses: Callable[[argparse.Namespace], bool]
    explain: str = ""  # what the sim adds to a bare assert (SGLang prints only a traceback)

    def text(self, ns: argparse.Namespace) -> str:
        what = (
            self.message.format(**vars(ns), choices=list(DETERMINISTIC_ATTENTION_BACKEND_CHOICES))
            if self.message
            else f"AssertionError: {self.explain}"
        )
        return f"{what} (SGLang {self.file}::{self.function})"


DEFAULT_CHUNKED_PREFILL = 8192  # memory_hook.py for GPUs under 160 GB (the profile's default_chunked_prefill_size)


def _chunked(ns: argparse.Namespace) -> int:
    return ns.chunked_prefill_size if ns.chunked_prefill_size is not None else DEFAULT_CHUNKED_PREFILL


def _no_buffer(ns: argparse.Namespace) -> bool:
    """model_hook.py::handle_mamba_radix_cache validates an explicit no_buffer strategy on a mamba model whose radix
    cache is on (overrides.py::_mamba_radix_cache_resolution; 'auto' resolves itself to a valid pair). It runs in
    handle_model_specific_adjustments, before handle_deterministic_inference can turn the radix cache off
    (arg_groups/pipeline.py), so the user's own --disable-radix-cache is what counts."""
    return ns.mamba_radix_cache_strategy == "no_buffer" and not ns.disable_radix_cache


# In SGLang's order of resolution (arg_groups/pipeline.py): model-specific adjustments, speculative, deterministic.
REFUSALS: tuple[Refusal, ...] = (
    Refusal(
        "arg_groups/mamba_hook.py",
        "validate_mamba_no_buffer",
        "no_buffer only supports page_size=1.",
        lambda ns: _no_buffer(ns) and ns.page_size not in (1, None),
    ),
    Refusal(
        "arg_groups/mamba_hook.py",
        "validate_mamba_no_buffer",
        "no_buffer do not support overlap schedule. Try to set disable_overlap_schedule=True.",
        lambda ns: _no_buffer(ns) and not ns.disable_overlap_schedule,
    ),
    Refusal(
        "arg_groups/mamba_hook.py",
        "validate_mamba_no_buffer",
        "no_buffer do not support trtllm_mha attention backend.",
        lambda ns: _no_buffer(ns) and ns.attention_backend == "trtllm_mha",
    ),
    Refusal(
        "arg_groups/speculative_hook.py",
        "_handle_eagle_family",
        "",
        lambda ns: (
            ns.speculative_algorithm is not None
            and ns.speculative_num_steps is None
            and (ns.speculative_eagle_topk is not None or ns.speculative_num_draft_tokens is not None)
        ),
        explain="--speculative-eagle-topk and --speculative-num-draft-tokens need --speculative-num-steps "
        "(leave all three unset for the automatic choice)",
    ),
    Refusal(
        "arg_groups/speculative_hook.py",
        "_handle_eagle_family",
        "trtllm_mha backend only supports topk = 1 for speculative decoding.",
        lambda ns: (
            ns.speculative_algorithm is not None
            and ns.attention_backend == "trtllm_mha"
            and (ns.speculative_eagle_topk or 1) > 1
        ),
    ),
    Refusal(
        "arg_groups/speculative_hook.py",
        "_handle_eagle_family",
        "--speculative-use-rejection-sampling is incompatible with --speculative-accept-threshold-single / "
        "--speculative-accept-threshold-acc; rejection sampling ignores the accept thresholds.",
        lambda ns: (
            ns.speculative_algorithm is not None
            and ns.speculative_use_rejection_sampling
            and (ns.speculative_accept_threshold_single != 1.0 or ns.speculative_accept_threshold_acc != 1.0)
        ),
    ),
    Refusal(
        "arg_groups/overrides.py",
        "_deterministic_attention_backend",
        "Currently only {choices} attention backends are supported for deterministic inference, but you "
        "explicitly specified '{attention_backend}'.",
        lambda ns: (
            ns.enable_deterministic_inference
            and ns.attention_backend is not None
            and ns.attention_backend not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES
        ),
    ),
    # validation_hook.py::check_server_args, after the other hooks: the checks on flags alone (the platform is CUDA)
    *(
        Refusal("arg_groups/validation_hook.py", "check_server_args", message, refuses)
        for message, refuses in (
            (
                "tp_size must be divisible by number of nodes",
                lambda ns: ns.ep_join_mode != "scale" and (ns.tp_size * ns.pp_size) % ns.nnodes != 0,
            ),
            (
                "pp_max_micro_batch_size must be a positive integer or None (for auto-compute). "
                "Got: {pp_max_micro_batch_size}",
                lambda ns: ns.pp_max_micro_batch_size is not None and ns.pp_max_micro_batch_size < 1,
            ),
            (
                "--disable-cuda-graph-padding is incompatible with --enable-torch-compile. With padding disabled, "
                "every "
                "distinct batch size gets its own torch.compile + Triton autotune cycle (O(max_batch_size) "
                "compilations) "
                "instead of the small fixed set of padded bucket sizes, causing engine initialisation to stall for "
                "many "
                "minutes. Remove --disable-cuda-graph-padding or --enable-torch-compile.",
                lambda ns: ns.disable_cuda_graph_padding and ns.enable_torch_compile,
            ),
            (
                "multi-node data-parallel replicas are not supported; use attention DP (--attn-dp-size) across nodes",
                lambda ns: ns.dp_size > 1 and ns.nnodes != 1,
            ),
            ("base_gpu_id must be non-negative", lambda ns: ns.base_gpu_id < 0),
            ("gpu_id_step must be positive", lambda ns: ns.gpu_id_step < 1),
            (
                "moe_dense_tp_size only supports None, 1, or tp_size currently",
                lambda ns: ns.moe_dense_tp_size not in (None, 1, ns.tp_size),
            ),
            ("Tokenizer worker num must >= 1", lambda ns: ns.tokenizer_worker_num <= 0),
            ("Detokenizer worker num must >= 1", lambda ns: ns.detokenizer_worker_num <= 0),
            ("Multimodal processor worker num must >= 0", lambda ns: ns.mm_processor_worker_num < 0),
            ("Multimodal I/O worker num must >= 0", lambda ns: ns.mm_io_worker_num < 0),
            ("schedule_conservativeness must be non-negative", lambda ns: ns.schedule_conservativeness < 0),
            (
                "served_model_name cannot contain a colon (':') character. The colon is reserved for the "
                "'model:adapter' "
                "syntax used in LoRA adapter specification. Invalid value: '{served_model_name}'",
                lambda ns: ":" in (ns.served_model_name or ns.model_path),
            ),
            (
                "chunked_prefill_size must be divisible by page_size",
                lambda ns: (
                    _chunked(ns) > 0 and ns.disaggregation_mode != "decode" and _chunked(ns) % (ns.page_size or 1) != 0
                ),
            ),
            (
                "PD-Multiplexing is only supported with pipeline parallelism disabled (pp_size=1).",
                lambda ns: ns.enable_pdmux and ns.pp_size != 1,
            ),
            (
                "PD-Multiplexing is not compatible with chunked prefill.",
                lambda ns: ns.enable_pdmux and _chunked(ns) != -1,
            ),
            (
                "PD-Multiplexing is not compatible with disaggregation mode.",
                lambda ns: ns.enable_pdmux and ns.disaggregation_mode != "null",
            ),
            (
                "PD-Multiplexing is not compatible with overlap schedule.",
                lambda ns: ns.enable_pdmux and not ns.disable_overlap_schedule,
            ),
            (
                "To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'. '{schedule_policy}' is not "
                "supported.",
                lambda ns: ns.enable_priority_scheduling and ns.schedule_policy not in ("fcfs", "lof"),
            ),
            (
                "--retraction-policy priority requires --enable-priority-scheduling",
                lambda ns: ns.retraction_policy == "priority" and not ns.enable_priority_scheduling,
            ),
            ("MindSpore model impl is only supported on Ascend npu.", lambda ns: ns.model_impl == "mindspore"),
            (
                "InstantTensor requires a CUDA-compatible device (including CUDA and ROCm); got {device!r}.",
                lambda ns: ns.load_format == "instanttensor" and ns.device not in (None, "cuda"),
            ),
            (
                "Please set --tokenizer-metrics-custom-labels-header when setting "
                "--tokenizer-metrics-allowed-custom-labels.",
                lambda ns: not ns.tokenizer_metrics_custom_labels_header and ns.tokenizer_metrics_allowed_custom_labels,
            ),
            (
                "--export-metrics-to-file-dir is required when --export-metrics-to-file is enabled",
                lambda ns: ns.export_metrics_to_file and ns.export_metrics_to_file_dir is None,
            ),
            (
                "Communications quantization is only used with tp_size != 1",
                lambda ns: ns.enable_quant_communications and ns.tp_size == 1,
            ),
            ("Communications quantization is only supported for NPU device", lambda ns: ns.enable_quant_communications),
            (
                "--grpc-port ({grpc_port}) must differ from --port ({port})",
                lambda ns: not (ns.smg_grpc_mode or ns.grpc_mode) and ns.grpc_port == ns.port,
            ),
            (
                "When setting gc_threshold, it must contain 1 to 3 integers.",
                lambda ns: bool(ns.gc_threshold) and not 1 <= len(ns.gc_threshold) <= 3,
            ),
            (
                "--kv-canary-sweep-interval requires --kv-canary in {{log, raise}}",
                lambda ns: ns.kv_canary_sweep_interval > 0 and ns.kv_canary == "none",
            ),
        )
    ),
)


def refusal(ns: argparse.Namespace) -> str | None:
    """The first of SGLang's resolution refusals these flags hit (one line), or None."""
    for r in REFUSALS:
        if r.refuses(ns):
            return r.text(ns)
    return None


def resolve_backends(ns: argparse.Namespace, warnings: list[str], gpu_arch: str = GPU_ARCH) -> None:
    """The sampling backend, and what --enable-deterministic-inference changes (written into ``ns`` as SGLang's
    /server_info then reports it):

    - sampling backend pytorch (overrides.py::_deterministic_sampling_backend; otherwise flashinfer on CUDA,
      overrides.py::_sampling_backend_default);
    - attention backend, when unset, flashinfer on Blackwell and fa3 before it (_deterministic_attention_backend);
    - the radix (prefix) cache off unless that backend is fa3 / fa4 / triton (attention_hook.py::
      handle_deterministic_inference, RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND in choices.py);
    - with TP > 1 custom and symmetric-memory all-reduce off and NCCL's tree algorithm (the same function);
    - flashinfer all-reduce fusion off (model_hook.py::handle_model_specific_adjustments,
      overrides.py::_deterministic_allreduce_fusion_disable).
    """
    if ns.sampling_backend is None:
        ns.sampling_backend = "flashinfer"
    if not ns.enable_deterministic_inference:
        return
    ns.enforce_disable_flashinfer_allreduce_fusion = True
    if ns.flashinfer_allreduce_fusion_backend is not None:
        warnings.append("Disable --flashinfer-allreduce-fusion-backend because deterministic inference is enabled.")
        ns.flashinfer_allreduce_fusion_backend = None
    if ns.sampling_backend != "ascend":
        warnings.append("Sampling backend is set to pytorch for deterministic inference.")
        ns.sampling_backend = "pytorch"
    if ns.attention_backend is None:
        ns.attention_backend = "flashinfer" if gpu_arch in BLACKWELL else "fa3"
        warnings.append(
            f"Attention backend not specified. Falling back to '{ns.attention_backend}' for deterministic "
            f"inference. You can explicitly set --attention-backend to one of "
            f"{list(DETERMINISTIC_ATTENTION_BACKEND_CHOICES)}."
        )
    if ns.attention_backend not in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND:
        ns.disable_radix_cache = True
        warnings.append(
            f"Currently radix cache is not compatible with {ns.attention_backend} attention backend for "
            "deterministic inference. It will be supported in the future."
        )
    if ns.tp_size > 1:
        ns.disable_custom_all_reduce = True
        ns.enable_torch_symm_mem = False
        warnings.append(
            "NCCL_ALGO is set to 'allreduce:tree', the NCCL channel count is pinned, and custom and "
            "symmetric-memory all reduce are disabled for deterministic inference when TP size > 1."
        )
