from setuptools import setup

setup(
    name="specdec",
    version="0.1.0",
    description="Draft-free speculative decoding (prompt lookup, Jacobi, lookahead) with Triton kernels "
    "over a paged KV cache",
    license="Apache-2.0",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=["kernels", "models", "decoding", "bench", "bench.data"],
    # the C sources: built on first use
    package_data={"bench.data": ["*.jsonl", "*.json", "*.md", "*.txt"], "kernels": ["cpu/*.c", "cpu/*.h"],
                  "decoding": ["cpu/*.c", "cpu/*.h"], "models": ["cpu/*.c", "cpu/*.h"]},
    install_requires=[
        # CPU machines: install torch==2.13.0 first (a local CPU build); the range below then
        # installs nothing more. GPU machines keep their own torch.
        "torch>=2.5",  # SDPA enable_gqa
        "triton>=3.0",
        "transformers>=4.56",  # from_pretrained(dtype=...); tokenizers and chat templates
        "accelerate",  # transformers refuses GGUF files without it (tests/test_errors.py shows it)
        "tokenizers",
        "jinja2",  # chat templates
        "gguf>=0.10",
        "safetensors",
        "numpy",
        "tqdm",
        "matplotlib",
    ],
    extras_require={
        "dev": ["pytest", "hypothesis", "ruff"],
        "flash": ["flash-attn"],
    },
)
