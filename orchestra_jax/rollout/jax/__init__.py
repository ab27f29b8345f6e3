"""The in-process JAX engine: batched prefill, a compiled decode loop over a KV cache, prefix reuse, fair queueing."""
