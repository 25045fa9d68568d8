"""The llama.cpp backend of the engine seam: GGUF models served as they are (llama-cpp-python's C API)."""
