"""Model backends: the one chat interface, OpenAI-compatible HTTP, llama.cpp, vLLM, the call cache and the factory."""
