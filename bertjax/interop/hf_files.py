"""The files of a Hugging Face model directory, read and written without torch or transformers.

Readers: model.safetensors (via safetensors.numpy), sharded safetensors (model.safetensors.index.json),
and pytorch_model.bin (zip format, single or sharded) through a restricted unpickler that allows only
the handful of torch classes a state dict needs, so that no torch import is needed and no code in the
file can run. The writer: config.json, model.safetensors and the optional vocabulary (with a
tokenizer.json where the family asks for one, bertjax/interop/hf_tokenizer.py). What the tensors mean
(names, layouts) is the families' business (bertjax/interop/hf.py).
"""

import collections
import dataclasses
import json
import logging
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors.numpy  # numpy flavour: no torch

from bertjax.interop import hf_tokenizer
from bertjax.models.config import BertConfig

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Reading weight files
# --------------------------------------------------------------------------------------------------

# torch storage class -> numpy dtype of its elements.
_TORCH_STORAGES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16,
    "LongStorage": np.int64,  # buffers such as position_ids
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


@dataclasses.dataclass(frozen=True)
class _StorageType:
    """Stands in for torch.FloatStorage & co. in the pickle: all we need of it is the dtype."""

    dtype: np.dtype


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None):
    """torch._utils._rebuild_tensor_v2 for numpy: a (possibly strided) view of a 1-D storage."""
    size, stride = tuple(size), tuple(stride)
    if any(n == 0 for n in size):
        return np.zeros(size, storage.dtype)
    # Bounds check before as_strided, which would otherwise read whatever memory lies beyond.
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if storage_offset < 0 or min(stride, default=0) < 0 or last >= storage.size:
        raise ValueError(f"corrupt tensor in pytorch checkpoint: size {size}, stride {stride} beyond its storage")
    view = np.lib.stride_tricks.as_strided(
        storage[storage_offset:], shape=size, strides=[s * storage.itemsize for s in stride], writeable=False
    )
    return np.ascontiguousarray(view)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
    return data  # an nn.Parameter is its tensor, for our purposes


class _RestrictedTorchUnpickler(pickle.Unpickler):
    """Unpickles a torch.save'd state dict into numpy arrays, refusing every class but a state dict's.

    A pickle can call any importable function; allowing only these few makes loading a downloaded
    pytorch_model.bin as safe as reading a safetensors file.
    """

    _ALLOWED = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("collections", "OrderedDict"): collections.OrderedDict,
    }

    def __init__(self, file, archive: zipfile.ZipFile, root: str, byteorder: str):
        super().__init__(file)
        self._archive, self._root, self._byteorder = archive, root, byteorder
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == "torch" and name in _TORCH_STORAGES:
            return _StorageType(np.dtype(_TORCH_STORAGES[name]))
        raise pickle.UnpicklingError(
            f"pytorch checkpoint refers to {module}.{name}, which a plain state dict does not contain: "
            "refusing to load it (re-save the weights as safetensors)"
        )

    def persistent_load(self, pid):
        # pid = ("storage", storage type, key, location, numel); the bytes live in <root>/data/<key>.
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id in pytorch checkpoint: {pid!r}")
        _, storage_type, key, _, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"unsupported storage type in pytorch checkpoint: {storage_type!r}")
        if key not in self._storages:
            raw = self._archive.read(f"{self._root}/data/{key}")
            dtype = storage_type.dtype.newbyteorder("<" if self._byteorder == "little" else ">")
            storage = np.frombuffer(raw, dtype=dtype)  # a read-only view of the bytes
            if storage.size < numel:
                raise ValueError(f"pytorch checkpoint storage {key} holds {storage.size} elements, expected {numel}")
            self._storages[key] = storage.astype(storage_type.dtype, copy=False)  # native order
        return self._storages[key]


def read_torch_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """A torch.save'd state dict (zip format, torch >= 1.6) -> name -> numpy array, without torch."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a zip-format PyTorch checkpoint (legacy torch < 1.6 format?): re-save it with a "
            "recent torch (torch.save(torch.load(f), f)) or as safetensors (model.save_pretrained(dir))"
        )
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one <root>/data.pkl in the zip, found {pickles}")
        root = pickles[0].split("/")[0]
        byteorder = "little"
        if f"{root}/byteorder" in archive.namelist():
            byteorder = archive.read(f"{root}/byteorder").decode().strip()
        with archive.open(pickles[0]) as f:
            state = _RestrictedTorchUnpickler(f, archive, root, byteorder).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (name -> tensor) but a {type(state).__name__}")
    if "state_dict" in state and isinstance(state["state_dict"], dict):  # a training checkpoint wrapper
        state = state["state_dict"]
    return {name: value for name, value in state.items() if isinstance(value, np.ndarray)}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    return safetensors.numpy.load_file(str(path))


# Weight files in the order transformers prefers them: (file name or shard index, reader of one file).
_WEIGHT_FILES = (
    ("model.safetensors", read_safetensors),
    ("model.safetensors.index.json", read_safetensors),
    ("pytorch_model.bin", read_torch_state_dict),
    ("pytorch_model.bin.index.json", read_torch_state_dict),
)


def find_weights(directory: str | os.PathLike) -> Path | None:
    """The weight file (or shard index) transformers would load from this directory, or None."""
    for name, _ in _WEIGHT_FILES:
        if (Path(directory) / name).is_file():
            return Path(directory) / name
    return None


def read_hf_weights(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a Hugging Face model directory (single or sharded safetensors / pytorch .bin)."""
    directory = Path(directory)
    path = find_weights(directory)
    if path is None:
        raise ValueError(
            f"{directory} has no weights: expected one of {[name for name, _ in _WEIGHT_FILES]}"
        )
    reader = dict(_WEIGHT_FILES)[path.name]
    if not path.name.endswith(".index.json"):
        return reader(path)
    # Sharded: the index maps every tensor name to its shard file.
    weight_map = json.loads(path.read_text())["weight_map"]
    state = {}
    for shard in sorted(set(weight_map.values())):
        state.update(reader(directory / shard))
    absent = sorted(set(weight_map) - set(state))
    if absent:
        raise ValueError(f"{path} lists tensors that are in none of its shards, e.g. {absent[:3]}")
    return state


# --------------------------------------------------------------------------------------------------
# Writing a directory
# --------------------------------------------------------------------------------------------------


def _readable_as_the_others(path: Path) -> None:
    """safetensors writes through a private temporary file (mode 0600); the directory's other files get
    the process's umask, and so does this one."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_directory(path, cfg: BertConfig, state: dict[str, np.ndarray], hf_config: dict,
                    vocab_path, lower_case: bool, tokenizer_json: bool):
    """config.json, model.safetensors and the optional WordPiece vocabulary of a transformers model
    directory; tokenizer_json: the vocabulary as a tokenizer.json too (the family's Family.tokenizer_json)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtypes = {str(x.dtype) for x in state.values()}
    if len(dtypes) == 1:  # say what was written, so that transformers loads it in that dtype
        hf_config["dtype"] = hf_config["torch_dtype"] = dtypes.pop()
    # "format": "pt" is the metadata transformers' own files carry.
    safetensors.numpy.save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    _readable_as_the_others(path / "model.safetensors")
    (path / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    if vocab_path is not None:
        if Path(vocab_path).resolve() != (path / "vocab.txt").resolve():
            shutil.copyfile(vocab_path, path / "vocab.txt")
        tokenizer_config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": lower_case,
            "model_max_length": cfg.max_position_embeddings,
            "model_input_names": model_input_names(cfg),
        }
        if tokenizer_json:
            # AutoTokenizer takes tokenizer_class over RoBERTa's and ALBERT's own, but for ModernBERT's
            # model_type it reads tokenizer.json only, with the special tokens named here.
            hf_tokenizer.write_wordpiece_tokenizer(str(path / "vocab.txt"), lower_case, str(path))
            tokenizer_config.update(unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]",
                                    mask_token="[MASK]")
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    log.info("wrote Hugging Face checkpoint %s (%d tensors)", path, len(state))


def model_input_names(cfg: BertConfig) -> list[str]:
    """What the exported tokenizer gives the model: token_type_ids only where the model has two segment
    rows or more. HF RoBERTa has one (a pair's 1s would index past it) and ModernBERT none; bertjax reads
    row 0 for every segment id of a one-row table, so leaving them out computes what bertjax does."""
    if cfg.type_vocab_size >= 2:
        return ["input_ids", "token_type_ids", "attention_mask"]
    return ["input_ids", "attention_mask"]
