"""dpsynrag_jax: differentially private synthetic RAG databases (DP-SynRAG) in JAX."""

import setuptools

INSTALL_REQUIRES = [
    "jax>=0.7,<0.11",
    "flax>=0.11,<0.13",
    "numpy>=1.26,<3",
    "scipy>=1.11,<2",
    "dp-accounting>=0.4.4,<0.7",
    "faiss-cpu>=1.8,<2",
    "absl-py>=2.0,<3",
    "ml-collections>=0.1.1,<2",
    "transformers>=4.46,<6",
    "tokenizers>=0.20,<1",
    "safetensors>=0.4.3,<1",
    "gguf>=0.10,<1",
    "huggingface_hub>=0.26,<3",
    "tqdm>=4.66,<5",
    "matplotlib>=3.8,<4",
    "jinja2>=3.1,<4",
    # The public keyword vocabulary V and its word frequencies (data CC-BY-SA 4.0).
    "wordfreq>=3.0,<4",
]

EXTRAS_REQUIRE = {
    # Reference implementations for parity tests only; never imported by the package.
    "test": [
        "pytest>=8,<10",
        # make test runs the suite in one worker per core (compiling is single-threaded).
        "pytest-xdist>=3.5,<4",
        "hypothesis>=6.100,<7",
        "torch==2.13.0",
        "accelerate>=1.0,<2",
    ],
    "gpu": [
        "jax[cuda12]>=0.7,<0.11",
        "faiss-gpu>=1.8,<2",
    ],
}

setuptools.setup(
    name="dpsynrag_jax",
    version="0.1.0",
    description="DP-SynRAG: differentially private synthetic text databases for RAG, in JAX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["dpsynrag_jax", "dpsynrag_jax.*", "experiments",
                                               "experiments.*", "launch", "launch.*"]),
    package_data={"dpsynrag_jax.data": ["vendored/**/*"]},
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
