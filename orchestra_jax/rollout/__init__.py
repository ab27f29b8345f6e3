"""Generation behind one protocol: the in-process JAX engine, HTTP clients of vLLM/SGLang/our server, and that server."""
