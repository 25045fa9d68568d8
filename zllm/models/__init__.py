"""The model store and the places models are pulled from (HF hub, local dirs, GGUF files, offline mirror).

    store = ModelStore(load_settings().models_dir)
    with RichPullProgress() as progress:
        model = store.pull("smollm2", progress=progress)   # idempotent; PullError on failure
    AutoModelForCausalLM.from_pretrained(model.path)

See store.py for the on-disk layout and its all-or-nothing invariant.
"""

from zllm.models.manifest import MANIFEST_FILE, Manifest
from zllm.models.progress import NullProgress, PullProgress, RichPullProgress
from zllm.models.store import ModelStore, StoredModel

__all__ = [
    "MANIFEST_FILE",
    "Manifest",
    "ModelStore",
    "NullProgress",
    "PullProgress",
    "RichPullProgress",
    "StoredModel",
]
