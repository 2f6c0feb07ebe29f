"""Prometheus texts as model servers publish them at /metrics: short excerpts in each
server's own names, labels and formatting (vLLM and SGLang through prometheus_client, as in
vllm/v1/metrics/loggers.py and python/sglang/srt/metrics/collector.py; llama-server's own
writer, tools/server/server-task.cpp, as `llama-server --metrics` of the version dragoman builds
answers), for dragoman.upstream.gauges."""

from __future__ import annotations

# vLLM (v1 engine) with two data-parallel engines: each engine's series are its own requests.
VLLM = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 14321.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="Qwen/Qwen3-8B",engine="0"} 12.0
vllm:num_requests_running{model_name="Qwen/Qwen3-8B",engine="1"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="Qwen/Qwen3-8B",engine="0"} 3.0
vllm:num_requests_waiting{model_name="Qwen/Qwen3-8B",engine="1"} 1.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen3-8B",engine="0"} 0.91
vllm:gpu_cache_usage_perc{model_name="Qwen/Qwen3-8B",engine="1"} 0.75
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="Qwen/Qwen3-8B",engine="0"} 0.91
vllm:kv_cache_usage_perc{model_name="Qwen/Qwen3-8B",engine="1"} 0.75
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="Qwen/Qwen3-8B",engine="0"} 8.81263e+06
vllm:prefix_cache_queries_total{model_name="Qwen/Qwen3-8B",engine="1"} 7.02211e+06
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="Qwen/Qwen3-8B",engine="0"} 0.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-8B",engine="0"} 5123.0
vllm:time_to_first_token_seconds_count{model_name="Qwen/Qwen3-8B",engine="0"} 5123.0
vllm:time_to_first_token_seconds_sum{model_name="Qwen/Qwen3-8B",engine="0"} 2049.7
"""

# vLLM before 0.9 (the v0 engine): the KV cache under its old name only.
VLLM_V0 = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:num_requests_swapped Number of requests swapped to CPU.
# TYPE vllm:num_requests_swapped gauge
vllm:num_requests_swapped{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.3125
"""

# SGLang with tensor parallelism 2: each rank's scheduler publishes the same queue.
SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"} 7.0
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="1",pp_rank="0"} 7.0
# HELP sglang:num_used_tokens The number of used tokens.
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"} 151234.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"} 0.62
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="1",pp_rank="0"} 0.62
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"} 5.0
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="1",pp_rank="0"} 5.0
# HELP sglang:num_running_reqs_offline_batch The number of running low-priority offline batch requests(label is 'batch').
# TYPE sglang:num_running_reqs_offline_batch gauge
sglang:num_running_reqs_offline_batch{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"} 30.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct",engine_type="unified",tp_rank="0",pp_rank="0"} 0.87
"""

# llama-server --metrics (no labels, integers without a decimal point; no KV-cache figure).
LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4812
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 20113
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 2311.51
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 3.5
"""

# An older llama-server that still published its KV cache's use.
LLAMACPP_OLD = """\
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# HELP llamacpp:requests_processing Number of request processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of request deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def vllm(running: float, waiting: float, kv_usage: float = 0.5) -> str:
    """A one-engine vLLM's load in its own names, for a fake replica to publish."""
    labels = '{model_name="test-model",engine="0"}'
    return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} {running}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{labels} {waiting}\n"
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{labels} {kv_usage}\n")  # fmt: skip
