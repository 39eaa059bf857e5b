"""sentence-transformers directories, read and written without torch or sentence-transformers.

A SentenceTransformer directory is a pipeline of modules listed in modules.json, each in its folder:

    modules.json                       [{"idx", "name", "path", "type"}, ...] in order
    <Transformer>  ("" or 0_Transformer) a Hugging Face directory of one family, sentence_bert_config.json
                                       (max_seq_length; query_length, the limit of encode_query's texts)
    1_Pooling/config.json              pooling_mode ("mean", or a list concatenated in order; before 5.x
                                       the booleans pooling_mode_<mode>_tokens), include_prompt
    2_Dense/config.json, weights       optional: in/out_features, bias, activation_function; linear.weight
                                       [out, in] and linear.bias in model.safetensors or pytorch_model.bin
    3_Normalize/                       optional: L2 normalisation
    config_sentence_transformers.json  prompts, default_prompt_name, similarity_fn_name, model_type

bertjax runs what models/pooling.py's SentenceEmbedder computes, so it reads the pipelines of that
shape: Transformer, Pooling, then optionally Dense, then optionally Normalize. The Transformer part is
any family's Hugging Face directory (interop/hf.py); what the rest says becomes the EmbeddingRecord and
the embedder's "dense" params. The writer lays out the same files around a Hugging Face export, as
sentence-transformers 6.2 saves them, a CrossEncoder directory around a sequence-classification one, and a
SparseEncoder (SPLADE: a fill-mask Transformer and SpladePooling; the inference-free variant a Router whose
query side is a SparseStaticEmbedding) around a masked-LM one (write_sparse_encoder; written, not read).

Shape legend: H hidden size, D the embedding's width, P pooled width (H times the pooling modes).
"""

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import safetensors.numpy  # numpy flavour: no torch

from bertjax.interop import hf_files
from bertjax.models import pooling
from bertjax.training.checkpoint_meta import EmbeddingRecord

MODULES_FILE = "modules.json"
MODEL_FILE = "config_sentence_transformers.json"
TRANSFORMER_FILE = "sentence_bert_config.json"
# The module classes bertjax runs, by class name (sentence_transformers.models.Dense before 5.x,
# sentence_transformers.base.modules.dense.Dense now): what each is in models/pooling.py.
MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
# Legacy pooling booleans, in the order sentence-transformers concatenates them.
_LEGACY_MODES = (("pooling_mode_cls_token", "cls"), ("pooling_mode_max_tokens", "max"),
                 ("pooling_mode_mean_tokens", "mean"), ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"),
                 ("pooling_mode_weightedmean_tokens", "weightedmean"), ("pooling_mode_lasttoken", "lasttoken"))
# Dense's activation_function (a torch class path) <-> models/pooling.py's ACTIVATIONS.
ACTIVATIONS = {"torch.nn.modules.activation.Tanh": "tanh", "torch.nn.modules.linear.Identity": "identity"}
SIMILARITIES = {"cosine": "cosine", "dot": "dot", "dot_product": "dot"}
_NO_LIMIT = 1_000_000  # a tokenizer_config's model_max_length above this is transformers' "no limit"
# sentence-transformers' encode_document: the first of these prompt names the model has.
DOCUMENT_PROMPTS = ("document", "passage", "corpus")
DOCUMENT = DOCUMENT_PROMPTS[0]


@dataclasses.dataclass(frozen=True)
class Embedder:
    """What a SentenceTransformer directory holds, as bertjax runs it."""

    transformer: str  # the Hugging Face directory of its Transformer module (the root, or 0_Transformer)
    record: EmbeddingRecord
    dense: dict | None  # {"kernel" [P, D], "bias" [D] (where it has one)}: numpy float32, or None
    pooled_width: int  # the Pooling module's input width (its embedding_dimension): the encoder's H
    lower_case: bool  # its Transformer lower-cases the text itself (sentence_bert_config's do_lower_case)


def is_directory(path: str) -> bool:
    """Whether `path` is a sentence-transformers directory to embed with: it has modules.json, and is no
    CrossEncoder (whose root is its Hugging Face sequence-classification directory, read as one)."""
    root = Path(path)
    if not (root / MODULES_FILE).is_file():
        return False
    try:
        model_type = (_json(root / MODEL_FILE, {}) or {}).get("model_type")
    except ValueError:
        return True  # read() says what is wrong with it
    return model_type != "CrossEncoder"


def document_prompt_name(prompts: dict) -> str | None:
    """The prompt a passage is embedded with: the first of DOCUMENT_PROMPTS the model has, as
    sentence-transformers' encode_document picks it, except that an empty one does not hide a later one
    that is not (sentence-transformers 6 saves an empty "document" placeholder beside a model's own
    "passage" prompt). None: the model's default prompt, if any."""
    present = [name for name in DOCUMENT_PROMPTS if name in prompts]
    return next((name for name in present if prompts[name]), present[0] if present else None)


def _json(path: Path, default=None):
    if not path.is_file():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None


def _module_kind(entry: dict, path: Path) -> str:
    """A modules.json entry's class, one of MODULES; anything else is one line naming it."""
    type_name = str(entry.get("type", ""))
    name = type_name.rsplit(".", 1)[-1]
    if not type_name.startswith("sentence_transformers.") or name not in MODULES:
        raise ValueError(f"{path / MODULES_FILE} names the module {type_name!r}: bertjax runs sentence-transformers' "
                         f"{', '.join(MODULES)} only (Transformer, Pooling, then optional Dense and Normalize)")
    return name


def read(path: str) -> Embedder:
    """The directory's embedder; each thing bertjax cannot run is one line naming its file."""
    root = Path(path)
    entries = _json(root / MODULES_FILE)
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{root / MODULES_FILE} lists no modules")
    entries = sorted(entries, key=lambda e: int(e.get("idx", 0)))
    kinds = [_module_kind(e, root) for e in entries]
    allowed = (["Transformer", "Pooling"], ["Transformer", "Pooling", "Dense"],
               ["Transformer", "Pooling", "Normalize"], ["Transformer", "Pooling", "Dense", "Normalize"])
    if kinds not in allowed:
        raise ValueError(f"{root / MODULES_FILE} has the modules {kinds}: bertjax runs Transformer, Pooling, then "
                         "optionally Dense, then optionally Normalize, in that order")
    folders = {kind: root / str(e.get("path", "")) for kind, e in zip(kinds, entries)}
    model = _model_settings(root)
    transformer = folders["Transformer"]
    if hf_files.find_weights(transformer) is None or not (transformer / "config.json").is_file():
        raise ValueError(f"{transformer}: its Transformer module has no Hugging Face model (config.json and "
                         "model.safetensors or pytorch_model.bin)")
    settings = _transformer_settings(transformer)
    modes, include_prompt, width = _pooling(folders["Pooling"])
    dense, dense_params = (_dense(folders["Dense"], width * len(modes)) if "Dense" in folders else (None, None))
    if "Normalize" in folders:
        _check_normalize(folders["Normalize"])
    record = EmbeddingRecord(modes=modes, normalize="Normalize" in folders, dense=dense, include_prompt=include_prompt,
                             max_seq_length=settings["max_seq_length"], max_query_length=settings["query_length"],
                             **model)
    return Embedder(str(transformer), record, dense_params, width, settings["do_lower_case"])


def _model_settings(root: Path) -> dict:
    """config_sentence_transformers.json: prompts, the default prompt and the similarity function."""
    config = _json(root / MODEL_FILE, {})
    model_type = config.get("model_type", "SentenceTransformer")
    if model_type != "SentenceTransformer":
        raise ValueError(f"{root / MODEL_FILE} says model_type={model_type!r}: bertjax embeds with "
                         "SentenceTransformer directories")
    similarity = config.get("similarity_fn_name") or "cosine"
    if similarity not in SIMILARITIES:
        raise ValueError(f"{root / MODEL_FILE} has similarity_fn_name={similarity!r}: bertjax scores with "
                         f"{' or '.join(sorted(set(SIMILARITIES.values())))}")
    prompts = {str(k): str(v or "") for k, v in (config.get("prompts") or {}).items()}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"{root / MODEL_FILE}: default_prompt_name={default!r} is none of its prompts "
                         f"{sorted(prompts)}")
    return dict(prompts=prompts, default_prompt_name=default, similarity=SIMILARITIES[similarity])


def _transformer_settings(folder: Path) -> dict:
    """sentence_bert_config.json's max_seq_length and do_lower_case (before 6.x it held both; now the
    tokenizer's model_max_length is the limit)."""
    config = _json(folder / TRANSFORMER_FILE, {})
    task = config.get("transformer_task", "feature-extraction")
    if task != "feature-extraction":
        raise ValueError(f"{folder / TRANSFORMER_FILE} has transformer_task={task!r}: bertjax embeds with the "
                         "encoder's token states (feature-extraction)")
    limit = config.get("max_seq_length")
    if limit is None:
        limit = _json(folder / "tokenizer_config.json", {}).get("model_max_length")
        limit = limit if isinstance(limit, int) and limit < _NO_LIMIT else None
    query = config.get("query_length")  # 6.x: the limit of texts encoded as queries (encode_query)
    return dict(max_seq_length=None if limit is None else int(limit), do_lower_case=bool(config.get("do_lower_case")),
                query_length=None if query is None else int(query))


def _pooling(folder: Path) -> tuple[tuple, bool, int]:
    """1_Pooling/config.json: (modes, include_prompt, the width it pools)."""
    config = _json(folder / "config.json")
    if config is None:
        raise ValueError(f"{folder} has no config.json: its Pooling module's settings are missing")
    modes = config.get("pooling_mode")
    if modes is None:  # before sentence-transformers 5.x: one boolean per mode
        modes = [mode for key, mode in _LEGACY_MODES if config.get(key)] or ["mean"]
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    unknown = [m for m in modes if m not in pooling.MODES]
    if unknown or not modes:
        raise ValueError(f"{folder / 'config.json'} has pooling_mode {unknown or 'none'}: bertjax pools with "
                         f"{', '.join(pooling.MODES)}")
    width = config.get("embedding_dimension", config.get("word_embedding_dimension"))
    return modes, bool(config.get("include_prompt", True)), int(width) if width is not None else 0


def _dense(folder: Path, pooled: int) -> tuple[dict, dict]:
    """2_Dense: its settings as the EmbeddingRecord's dense, and its params {"kernel" [P, D], "bias" [D]}."""
    config = _json(folder / "config.json")
    if config is None:
        raise ValueError(f"{folder} has no config.json: its Dense module's settings are missing")
    activation = config.get("activation_function", "torch.nn.modules.activation.Tanh")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{folder / 'config.json'} has activation_function={activation!r}: bertjax's Dense applies "
                         f"{' or '.join(ACTIVATIONS)}")
    if config.get("use_residual") or config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"{folder / 'config.json'}: bertjax's Dense projects the pooled embedding alone (no "
                         "use_residual, module_input_name 'sentence_embedding')")
    in_features, out_features = int(config["in_features"]), int(config["out_features"])
    if in_features != pooled:
        raise ValueError(f"{folder / 'config.json'} has in_features={in_features}, but its Pooling gives {pooled}")
    weights = hf_files.read_hf_weights(folder)
    bias = bool(config.get("bias", True))
    kernel = np.asarray(weights["linear.weight"], np.float32).T  # torch [D, P] -> [P, D]
    if kernel.shape != (in_features, out_features):
        raise ValueError(f"{folder}: linear.weight is {kernel.shape[::-1]}, its config says "
                         f"[{out_features}, {in_features}]")
    params = {"kernel": kernel}
    if bias:
        params["bias"] = np.asarray(weights["linear.bias"], np.float32)
    return dict(features=out_features, bias=bias, activation=ACTIVATIONS[activation]), params


def _check_normalize(folder: Path) -> None:
    config = _json(folder / "config.json", {})
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"{folder / 'config.json'} normalises {config['module_input_name']!r}: bertjax normalises "
                         "the sentence embedding only")


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------

_TYPES = {"Transformer": "sentence_transformers.base.modules.transformer.Transformer",
          "Pooling": "sentence_transformers.sentence_transformer.modules.pooling.Pooling",
          "Dense": "sentence_transformers.base.modules.dense.Dense",
          "Normalize": "sentence_transformers.base.modules.normalize.Normalize"}
_FEATURES = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def _modules(names: list[tuple[str, str]]) -> list[dict]:
    return [{"idx": i, "name": str(i), "path": folder, "type": _TYPES[kind]} for i, (kind, folder) in enumerate(names)]


def write_embedder(directory: str, record: EmbeddingRecord, dense: dict | None, hidden_size: int,
                   max_seq_length: int, do_lower_case: bool = False) -> None:
    """The sentence-transformers files around a Hugging Face directory already written at `directory`
    (the Transformer module, at the root as sentence-transformers 6.x saves it): modules.json, the
    Pooling, Dense and Normalize folders, config_sentence_transformers.json, sentence_bert_config.json,
    and the tokenizer's model_max_length set to max_seq_length; do_lower_case: sentence-transformers lower-cases
    the text before its tokenizer (a cased tokenizer's module that lower-cases).

    What sentence-transformers cannot express: before 6.x it has no query_length, so its encode_query cuts
    queries at max_seq_length, not at the record's max_query_length (bertjax's embed(task="query") and 6.x
    agree); and in every version the query length holds for encode_query alone, as it does for
    embed(task="query") alone: encode(prompt_name="query") cuts queries at max_seq_length in both. The
    passage prompt (document_prompt_name's) is written under "document" too, so that encode_document
    embeds as embed(task="document")."""
    root = Path(directory)
    names = [("Transformer", ""), ("Pooling", "1_Pooling")]
    modes = list(record.modes) if len(record.modes) > 1 else record.modes[0]  # one mode: a string, as 6.x writes it
    _write_json(root / "1_Pooling" / "config.json", {"embedding_dimension": hidden_size, "pooling_mode": modes,
                                                     "include_prompt": record.include_prompt})
    if record.dense is not None:
        folder = f"{len(names)}_Dense"
        names.append(("Dense", folder))
        _write_dense(root / folder, record.dense, dense, hidden_size * len(record.modes))
    if record.normalize:
        folder = f"{len(names)}_Normalize"
        names.append(("Normalize", folder))
        _write_json(root / folder / "config.json", {"module_input_name": "sentence_embedding",
                                                    "module_output_name": "sentence_embedding"})
    _write_json(root / MODULES_FILE, _modules(names))
    prompts = dict(record.prompts)
    passage = document_prompt_name(prompts)
    if passage not in (None, DOCUMENT) and prompts[passage]:
        # sentence-transformers 6.3 gives a model without a "document" prompt an empty one, which its
        # encode_document then takes before "passage": the passage prompt written under "document" too.
        prompts[DOCUMENT] = prompts[passage]
    _write_json(root / MODEL_FILE, {"model_type": "SentenceTransformer", "prompts": prompts,
                                    "default_prompt_name": record.default_prompt_name,
                                    "similarity_fn_name": record.similarity})
    # max_seq_length for sentence-transformers before 6.x; 6.x reads the tokenizer's model_max_length.
    # query_length: 6.x cuts the texts of encode_query (task "query") to it, shorter or longer than
    # max_seq_length, as training cut the queries.
    query = {} if record.max_query_length is None else {"query_length": record.max_query_length}
    _write_json(root / TRANSFORMER_FILE, {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case,
                                          "transformer_task": "feature-extraction", "modality_config": _FEATURES,
                                          "module_output_name": "token_embeddings", **query})
    tokenizer_config = root / "tokenizer_config.json"
    if tokenizer_config.is_file():
        _write_json(tokenizer_config, {**_json(tokenizer_config), "model_max_length": max_seq_length})


def _write_dense(folder: Path, settings: dict, params: dict, in_features: int) -> None:
    activation = {name: path for path, name in ACTIVATIONS.items()}[settings["activation"]]
    _write_json(folder / "config.json", {"in_features": in_features, "out_features": int(settings["features"]),
                                         "bias": bool(settings["bias"]), "activation_function": activation,
                                         "module_input_name": "sentence_embedding",
                                         "module_output_name": "sentence_embedding"})
    state = {"linear.weight": np.ascontiguousarray(np.asarray(params["kernel"], np.float32).T)}  # [P, D] -> [D, P]
    if settings["bias"]:
        state["linear.bias"] = np.asarray(params["bias"], np.float32)
    safetensors.numpy.save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    umask = os.umask(0)  # safetensors writes through a private (0600) temporary file: the umask's mode, as the rest
    os.umask(umask)
    os.chmod(folder / "model.safetensors", 0o666 & ~umask)


# A SparseEncoder (SPLADE): the modules' classes and folders, as sentence-transformers 6.3 saves them.
_SPARSE_TYPES = {"Router": "sentence_transformers.base.modules.router.Router",
                 "SpladePooling": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling",
                 "SparseStaticEmbedding":
                     "sentence_transformers.sparse_encoder.modules.sparse_static_embedding.SparseStaticEmbedding"}
DOCUMENT_TRANSFORMER = "document_0_Transformer"  # the inference-free Router's document side: the masked-LM model
_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _write_fill_mask(folder: Path, max_seq_length: int, query_length: int | None, do_lower_case: bool) -> None:
    """A fill-mask Transformer module's settings beside its Hugging Face masked-LM directory: its logits are
    the token embeddings SpladePooling reads; texts cut to max_seq_length (queries: query_length)."""
    query = {} if query_length is None else {"query_length": query_length}
    _write_json(folder / TRANSFORMER_FILE, {"max_seq_length": max_seq_length, "do_lower_case": do_lower_case,
                                            "transformer_task": "fill-mask", "modality_config": {
                                                "text": {"method": "forward", "method_output_name": "logits"}},
                                            "module_output_name": "token_embeddings", **query})
    _set_max_length(folder, max_seq_length)


def _set_max_length(folder: Path, length: int) -> None:
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        _write_json(tokenizer_config, {**_json(tokenizer_config), "model_max_length": length})


def write_sparse_encoder(directory: str, record: EmbeddingRecord, vocab_size: int, max_seq_length: int,
                         static_weight=None, do_lower_case: bool = False) -> None:
    """The SparseEncoder files around a Hugging Face masked-LM directory already written: SPLADE as a fill-mask
    Transformer (at the root) then SpladePooling("max", "relu"); with static_weight [V] (the inference-free
    variant) a Router, its query side a SparseStaticEmbedding (the table, the tokenizer's files copied, cut at
    the record's max_query_length tokens, no special tokens), its document side the masked-LM model (written
    at DOCUMENT_TRANSFORMER) and SpladePooling. Prompts as write_embedder's, the similarity the dot product."""
    root = Path(directory)
    pooling_config = {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": vocab_size}
    query_length = record.max_query_length
    if static_weight is None:
        _write_fill_mask(root, max_seq_length, query_length, do_lower_case)
        _write_json(root / "1_SpladePooling" / "config.json", pooling_config)
        _write_json(root / MODULES_FILE, [{"idx": 0, "name": "0", "path": "", "type": _TYPES["Transformer"]},
                                          {"idx": 1, "name": "1", "path": "1_SpladePooling",
                                           "type": _SPARSE_TYPES["SpladePooling"]}])
    else:
        document, query = root / DOCUMENT_TRANSFORMER, root / "query_0_SparseStaticEmbedding"
        _write_fill_mask(document, max_seq_length, None, do_lower_case)
        _write_json(root / "document_1_SpladePooling" / "config.json", pooling_config)
        query.mkdir(parents=True, exist_ok=True)
        for name in _TOKENIZER_FILES:
            if (document / name).is_file():
                (query / name).write_bytes((document / name).read_bytes())
        _set_max_length(query, query_length or max_seq_length)
        _write_json(query / "config.json", {"frozen": False})
        safetensors.numpy.save_file({"weight": np.asarray(static_weight, np.float32)},
                                    str(query / "model.safetensors"), metadata={"format": "pt"})
        _write_json(root / "router_config.json", {
            "types": {"query_0_SparseStaticEmbedding": _SPARSE_TYPES["SparseStaticEmbedding"],
                      DOCUMENT_TRANSFORMER: _TYPES["Transformer"],
                      "document_1_SpladePooling": _SPARSE_TYPES["SpladePooling"]},
            "structure": {"query": ["query_0_SparseStaticEmbedding"],
                          "document": [DOCUMENT_TRANSFORMER, "document_1_SpladePooling"]},
            "parameters": {"default_route": "document", "allow_empty_key": True, "route_mappings": {}}})
        _write_json(root / MODULES_FILE, [{"idx": 0, "name": "0", "path": "", "type": _SPARSE_TYPES["Router"]}])
    passage = document_prompt_name(record.prompts)
    prompts = {"query": "", DOCUMENT: "", **record.prompts}
    prompts[DOCUMENT] = record.prompts[passage] if passage is not None else ""
    _write_json(root / MODEL_FILE, {"model_type": "SparseEncoder", "prompts": prompts,
                                    "default_prompt_name": record.default_prompt_name, "similarity_fn_name": "dot"})


def write_cross_encoder(directory: str) -> None:
    """The sentence-transformers files around a sequence-classification Hugging Face directory at
    `directory`, so that CrossEncoder loads it and predict gives its logits (classification: softmax
    them with apply_softmax=True) or, for a regression, its value (no sigmoid, the CrossEncoder default
    for one output)."""
    root = Path(directory)
    activation = "torch.nn.modules.linear.Identity"
    _write_json(root / MODULES_FILE, _modules([("Transformer", "")]))
    _write_json(root / MODEL_FILE, {"model_type": "CrossEncoder", "activation_fn": activation, "prompts": {},
                                    "default_prompt_name": None})
    _write_json(root / TRANSFORMER_FILE, {
        "transformer_task": "sequence-classification", "module_output_name": "scores",
        "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}}})
    config = _json(root / "config.json")  # where sentence-transformers 4.x and 5.x read the activation
    _write_json(root / "config.json", {**config, "sentence_transformers": {"activation_fn": activation}})
