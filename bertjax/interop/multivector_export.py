"""A ColBERT model as a sentence-transformers 6.x MultiVectorEncoder directory, written without torch or
sentence-transformers:

    modules.json                       Transformer "", Dense 1_Dense, MultiVectorMask 2_MultiVectorMask,
                                       Normalize 3_Normalize
    <the root>                         the Hugging Face encoder (interop/hf.py) and its tokenizer;
                                       sentence_bert_config.json: query_length, document_length and
                                       query_expansion {"strategy": "fixed", "attend", "length", "token"}
    1_Dense/                           the projection, token level: in/out_features, bias false, Identity,
                                       module_input_name "token_embeddings"; linear.weight [D, H]
    2_MultiVectorMask/config.json      skiplist_words, skiplist_tasks ["document"]
    3_Normalize/config.json            L2 normalisation of "token_embeddings"
    config_sentence_transformers.json  model_type "MultiVectorEncoder", the markers as the prompts "query" and
                                       "document", similarity_fn_name "maxsim"

Everything bertjax/tasks/multivector_texts.py does to a text is said here, so that encode_query and
encode_document compute ColbertEncoder's vectors: markers=token also registers each marker as a special
token of the tokenizer (tokenizer_config.json's extra_special_tokens), so that the prompt "[unused0] "
gives that one id, as Stanford ColBERT inserts it.

Shape legend: H hidden size, D projection width.
"""

import json
import os
from pathlib import Path

import flax.linen as nn
import numpy as np
import safetensors.numpy  # numpy flavour: no torch

from bertjax.interop import hf
from bertjax.interop.sentence_transformers import MODEL_FILE, MODULES_FILE, TRANSFORMER_FILE
from bertjax.models.config import BertConfig
from bertjax.models.multivector import PROJECTION
from bertjax.tasks.multivector_texts import KINDS, MultiVectorTexts

_TYPES = (("", "sentence_transformers.base.modules.transformer.Transformer"),
          ("1_Dense", "sentence_transformers.base.modules.dense.Dense"),
          ("2_MultiVectorMask", "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"),
          ("3_Normalize", "sentence_transformers.base.modules.normalize.Normalize"))
_TOKENS = "token_embeddings"  # the feature the modules after the Transformer read and write
_IDENTITY = "torch.nn.modules.linear.Identity"


def _write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def save(directory: str, cfg: BertConfig, params: dict, texts: MultiVectorTexts, vocab_path,
         lower_case: bool = True) -> None:
    """A MultiVectorEncoder directory of ColbertEncoder params ({"bert", "projection"}, boxed or plain) with a
    WordPiece vocabulary: the encoder through hf.save_hf_encoder, then write_modules. (Other tokenizers: write
    the encoder and its tokenizer files as the sentence-transformers export does, then write_modules.)"""
    params = nn.meta.unbox(params)
    hf.save_hf_encoder(directory, cfg, {"bert": params["bert"]}, vocab_path=vocab_path, lower_case=lower_case)
    write_modules(directory, params[PROJECTION]["kernel"], texts)


def write_modules(directory: str, kernel, texts: MultiVectorTexts, do_lower_case: bool = False) -> None:
    """The sentence-transformers files around the Hugging Face encoder and tokenizer already at `directory`:
    the projection kernel [H, D] as the token-level Dense, the texts' lengths, expansion, markers and
    skiplist as the modules' settings. do_lower_case: sentence-transformers lower-cases the text before a
    cased tokenizer (a BPE tokenizer that bertjax lower-cases)."""
    root = Path(directory)
    kernel = np.asarray(kernel, np.float32)  # [H, D]
    hidden, width = kernel.shape
    _write_json(root / MODULES_FILE, [{"idx": i, "name": str(i), "path": path, "type": kind}
                                      for i, (path, kind) in enumerate(_TYPES)])
    expansion = None
    if texts.query_expansion:  # the mask token is the tokenizer's own ("token": null)
        expansion = {"strategy": "fixed", "attend": texts.attend_expansion, "token": None, "length": texts.query_length}
    _write_json(root / TRANSFORMER_FILE, {
        "transformer_task": "feature-extraction", "do_lower_case": do_lower_case,
        "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
        "module_output_name": _TOKENS, "query_length": texts.query_length,
        "document_length": texts.document_length, "query_expansion": expansion})
    _write_json(root / "1_Dense" / "config.json", {"in_features": hidden, "out_features": width, "bias": False,
                                                   "activation_function": _IDENTITY, "module_input_name": _TOKENS,
                                                   "module_output_name": _TOKENS})
    weights = root / "1_Dense" / "model.safetensors"
    safetensors.numpy.save_file({"linear.weight": np.ascontiguousarray(kernel.T)}, str(weights),  # [D, H]
                                metadata={"format": "pt"})
    umask = os.umask(0)  # safetensors writes through a private (0600) temporary file: the umask's mode, as the rest
    os.umask(umask)
    os.chmod(weights, 0o666 & ~umask)
    _write_json(root / "2_MultiVectorMask" / "config.json", {"skiplist_words": list(texts.skiplist),
                                                            "skiplist_tasks": ["document"],
                                                            "keep_only_token_ids": None})
    _write_json(root / "3_Normalize" / "config.json", {"module_input_name": _TOKENS, "module_output_name": _TOKENS})
    _write_json(root / MODEL_FILE, {"model_type": "MultiVectorEncoder", "prompts": _prompts(texts),
                                    "default_prompt_name": None, "similarity_fn_name": "maxsim"})
    if texts.markers == "token":
        _register_markers(root, [texts.marker(kind) for kind in KINDS])


def _prompts(texts: MultiVectorTexts) -> dict:
    """The markers as sentence-transformers' prompts: written before each text (a token marker and a space,
    which the special token's split leaves before the text)."""
    if texts.markers == "none":
        return {}
    return {kind: texts.marker(kind) + (" " if texts.markers == "token" else "") for kind in KINDS}


def _register_markers(root: Path, markers: list[str]) -> None:
    """Each marker a special token of the directory's tokenizer: one piece, never lower-cased or split."""
    path = root / "tokenizer_config.json"
    if not path.is_file():
        raise ValueError(f"{root} has no tokenizer_config.json: write the encoder's tokenizer before its modules "
                         "(markers=token registers the markers there)")
    config = _read_json(path)
    known = list(config.get("extra_special_tokens") or [])
    _write_json(path, {**config, "extra_special_tokens": known + [m for m in markers if m not in known]})
