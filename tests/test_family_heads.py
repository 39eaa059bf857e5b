"""Task heads of the model families (RoBERTa, ALBERT, ModernBERT, MobileBERT; ELECTRA's heads too) to and from
their transformers task classes, for every task kind: random bertjax heads exported and loaded with nothing
missing, logits equal within 1e-5 (float32, eval mode, right-padded rows); HF's own randomly initialised task
models imported and written back bit for bit; a pretraining directory as a head's start; the exported
tokenizer (WordPiece or SentencePiece) through AutoTokenizer straight into the exported model; and a
fine-tuning run from a family's directory, exported back to its class."""

import functools
import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

from bertjax import init_from
from bertjax.interop import hf
from bertjax.models.config import BertConfig
from bertjax.models import heads

ATOL = 1e-5
KINDS = ("classification", "regression", "multiple_choice", "span", "tagging")
FAMILIES = ("roberta", "albert", "modernbert", "mobilebert")
# ELECTRA's task classes (its sequence classifier: dense, GELU, out_proj) in the head tests.
HEAD_FAMILIES = FAMILIES + ("electra",)
NUM_LABELS = {"classification": 3, "regression": None, "multiple_choice": None, "span": None, "tagging": 5}
SEQ = 12
CHOICES = 2

# Tiny configs of each family's transformers class (pad id 0 and [CLS] 2 / [SEP] 3, as bertjax's vocabularies).
HF_CONFIGS = {
    "roberta": dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                    max_position_embeddings=24, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=0,
                    bos_token_id=2, eos_token_id=3),
    "albert": dict(vocab_size=97, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_hidden_groups=1,
                   num_attention_heads=4, intermediate_size=48, max_position_embeddings=24, hidden_act="gelu_new",
                   pad_token_id=0, bos_token_id=2, eos_token_id=3),
    "modernbert": dict(vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=48, max_position_embeddings=32, local_attention=4,
                       global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2, cls_token_id=2, eos_token_id=3,
                       sep_token_id=3),
    "electra": dict(vocab_size=95, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=48, max_position_embeddings=24, pad_token_id=0),
    # The published network's options: no pooler dense (classifier_activation false), a shared q/k bottleneck.
    "mobilebert": dict(vocab_size=93, embedding_size=16, hidden_size=32, intra_bottleneck_size=16,
                       num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, num_feedforward_networks=2,
                       max_position_embeddings=24, classifier_activation=False, pad_token_id=0),
}
CONFIG_CLASSES = {"roberta": transformers.RobertaConfig, "albert": transformers.AlbertConfig,
                  "modernbert": transformers.ModernBertConfig, "electra": transformers.ElectraConfig,
                  "mobilebert": transformers.MobileBertConfig}
PRETRAINING_CLASSES = {"roberta": transformers.RobertaForMaskedLM, "albert": transformers.AlbertForPreTraining,
                       "modernbert": transformers.ModernBertForMaskedLM,
                       "electra": transformers.ElectraForPreTraining,
                       "mobilebert": transformers.MobileBertForPreTraining}


def hf_config(family: str, kind: str | None = None):
    labels = {} if kind is None else {"num_labels": NUM_LABELS[kind] or heads.head(kind).num_labels}
    return CONFIG_CLASSES[family](**HF_CONFIGS[family], **labels, attn_implementation="eager")


def bertjax_config(family: str) -> BertConfig:
    return hf.config_from_hf(hf_config(family).to_dict())


def randomize(hf_model, seed: int = 0):
    """Every parameter noise (norm scales around 1), so a wrong name or layout shows in the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            p.copy_(1.0 + 0.1 * noise if name.endswith("weight") and p.ndim == 1 else 0.05 * noise)
    return hf_model.eval()


def random_head(cfg, kind: str, seed: int = 0) -> dict:
    """A bertjax head's params, every leaf noise (norm scales around 1)."""
    net = heads.network(kind, cfg, NUM_LABELS[kind])
    shapes = jax.eval_shape(net.init, jax.random.key(seed), **heads.dummy_inputs(kind, 1, SEQ, CHOICES))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nn.meta.unbox(shapes["params"]))
    rng = np.random.default_rng(seed)
    noisy = [np.asarray(1.0 + 0.1 * rng.standard_normal(x.shape) if jax.tree_util.keystr(path).endswith("['scale']")
                        else 0.05 * rng.standard_normal(x.shape), np.float32) for path, x in leaves]
    return jax.tree_util.tree_unflatten(treedef, noisy)


def make_inputs(kind: str, vocab: int, segments: bool, seed: int = 0) -> dict:
    """Right-padded rows of lengths SEQ, 7 and 4 (pad id 0; real ids avoid the special ids 0..4); a pair's
    second segment from position 3 where the family has segments. Multiple choice: [3, CHOICES, SEQ]."""
    rng = np.random.default_rng(seed)
    rows = 3 * CHOICES if heads.head(kind).choices else 3
    lengths = np.resize([SEQ, 7, 4], rows)
    input_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    input_ids = np.where(input_mask == 1, rng.integers(5, vocab, size=(rows, SEQ)), 0).astype(np.int32)
    segment_ids = ((np.arange(SEQ)[None, :] >= 3) * input_mask).astype(np.int32) if segments else 0 * input_mask
    batch = dict(input_ids=input_ids, segment_ids=segment_ids, input_mask=input_mask)
    if heads.head(kind).choices:
        batch = {k: v.reshape(3, CHOICES, SEQ) for k, v in batch.items()}
    return batch


@functools.lru_cache(maxsize=None)
def _apply(cfg, kind: str):
    return jax.jit(heads.network(kind, cfg, NUM_LABELS[kind]).apply)  # compiled once per family and kind


def bertjax_logits(cfg, kind: str, params, batch) -> np.ndarray:
    return np.asarray(_apply(cfg, kind)({"params": params}, **batch))


def hf_logits(hf_model, kind: str, batch, segments: bool) -> np.ndarray:
    inputs = {"input_ids": torch.as_tensor(batch["input_ids"], dtype=torch.long),
              "attention_mask": torch.as_tensor(batch["input_mask"], dtype=torch.long)}
    if segments:
        inputs["token_type_ids"] = torch.as_tensor(batch["segment_ids"], dtype=torch.long)
    with torch.no_grad():
        out = hf_model(**inputs)
    if kind == "span":
        return torch.stack([out.start_logits, out.end_logits], dim=-1).numpy()
    return out.logits.numpy()


def assert_logits_equal(ours, theirs, kind: str, batch):
    assert ours.shape == theirs.shape
    if kind in ("span", "tagging"):  # per token: the real positions only
        real = batch["input_mask"].astype(bool)
        ours, theirs = ours[real], theirs[real]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)


def task_class(family: str, kind: str):
    return getattr(transformers, hf.FAMILIES[family].task_classes[kind].architecture)


# --------------------------------------------------------------------------------------------------
# Every family x every kind, both directions
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_a_bertjax_head_exports_to_its_family_class_with_equal_logits(family, kind, tmp_path):
    cfg = bertjax_config(family)
    params = random_head(cfg, kind)
    hf.save_hf_head(tmp_path, cfg, params, kind)  # the family found from the config's options
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [hf.FAMILIES[family].task_classes[kind].architecture]
    assert written.get("problem_type") == hf.HF_HEADS[kind].problem_type
    hf_model, info = task_class(family, kind).from_pretrained(tmp_path, output_loading_info=True,
                                                              attn_implementation="eager")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    segments = cfg.type_vocab_size >= 2
    batch = make_inputs(kind, cfg.vocab_size, segments)
    assert_logits_equal(bertjax_logits(cfg, kind, params, batch), hf_logits(hf_model.eval(), kind, batch, segments),
                        kind, batch)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_a_transformers_task_model_imports_and_exports_bit_for_bit(family, kind, tmp_path):
    torch.manual_seed(0)
    hf_model = randomize(task_class(family, kind)(hf_config(family, kind)), seed=1)
    hf_model.save_pretrained(tmp_path)
    loaded = init_from.load(init_from.resolve(str(tmp_path), tokenizer=False), head=kind, num_labels=NUM_LABELS[kind])
    family_record = hf.FAMILIES[family]
    # A class without the pooler (RoBERTa's and ALBERT's span and tagging): bertjax's is fresh, and unused.
    # MobileBERT's "first" pooler has no params to be fresh.
    has_pooler = family_record.task_classes[kind].pooler or loaded.config.pooler == "first"
    pooler = [] if has_pooler else ["bert/pooler/bias", "bert/pooler/kernel"]
    assert loaded.missing == pooler
    cfg, params = loaded.config, loaded.params
    segments = cfg.type_vocab_size >= 2
    batch = make_inputs(kind, cfg.vocab_size, segments, seed=1)
    assert_logits_equal(bertjax_logits(cfg, kind, params, batch), hf_logits(hf_model, kind, batch, segments), kind,
                        batch)
    state = hf.head_params_to_hf(params, cfg, kind)
    reference = {k: v.numpy() for k, v in hf_model.state_dict().items() if not k.endswith("_ids")}
    assert sorted(state) == sorted(reference)
    for name, x in state.items():
        np.testing.assert_array_equal(x, reference[name], err_msg=name)


def test_every_task_kind_has_a_class_in_every_family():
    for family in hf.FAMILIES.values():
        assert set(family.task_classes) == set(hf.HF_HEADS) == set(heads.HEADS) - {"contrastive"}, family.model_type
        for task in family.task_classes.values():
            assert hasattr(transformers, task.architecture), task.architecture


# --------------------------------------------------------------------------------------------------
# A pretraining directory as a head's start; what is refused
# --------------------------------------------------------------------------------------------------


# The pretraining class's pooler where it has one (ALBERT's; ModernBERT's masked-LM head is its task
# classes' `head` too, and loads as the pooler, as transformers loads it): else it is fresh.
FRESH = {"roberta": ["bert/pooler/bias", "bert/pooler/kernel"], "albert": [], "modernbert": [],
         "electra": ["bert/pooler/bias", "bert/pooler/kernel"], "mobilebert": []}


@pytest.mark.parametrize("family", HEAD_FAMILIES)
def test_a_pretraining_directory_loads_as_a_head_with_a_fresh_classifier(family, tmp_path):
    torch.manual_seed(0)
    hf_model = randomize(PRETRAINING_CLASSES[family](hf_config(family)), seed=2)
    hf_model.save_pretrained(tmp_path)
    head = init_from.load(init_from.resolve(str(tmp_path), tokenizer=False), head="tagging", num_labels=4)
    assert sorted(head.missing) == sorted(FRESH[family] + ["classifier/bias", "classifier/kernel"])
    assert head.params["classifier"]["kernel"].shape == (32, 4)
    whole = init_from.load(init_from.resolve(str(tmp_path), tokenizer=False))
    jax.tree_util.tree_map(np.testing.assert_array_equal, head.params["bert"]["encoder"],
                           whole.params["bert"]["encoder"])
    if family == "modernbert":
        np.testing.assert_array_equal(head.params["bert"]["pooler"]["kernel"],
                                      whole.params["mlm_head"]["transform"]["kernel"])


def test_what_a_family_head_cannot_be_is_one_line(tmp_path):
    cfg = bertjax_config("modernbert")
    params = random_head(cfg, "classification")
    tanh = BertConfig(**{**cfg.__dict__, "pooler": "tanh"})
    tanh_params = random_head(tanh, "classification")
    with pytest.raises(ValueError, match=r"a modernbert 'classification' head needs model.pooler='gelu_norm'"):
        hf.save_hf_head(tmp_path / "tanh", tanh, tanh_params, "classification")
    hf.save_hf_head(tmp_path / "mean", cfg, params, "classification")
    written = json.loads((tmp_path / "mean" / "config.json").read_text())
    (tmp_path / "mean" / "config.json").write_text(json.dumps({**written, "classifier_pooling": "mean"}))
    with pytest.raises(ValueError, match=r"classifier_pooling='mean': bertjax's heads pool \[CLS\] only"):
        init_from.load(init_from.resolve(str(tmp_path / "mean"), tokenizer=False), head="classification", num_labels=3)
    with pytest.raises(ValueError, match=r"model options \['pooler'\] make a network no Hugging Face class has"):
        hf.family_of_config(BertConfig(pooler="gelu_norm"))


# --------------------------------------------------------------------------------------------------
# The exported tokenizer: AutoTokenizer gives bertjax's ids, and its output goes straight into the model
# --------------------------------------------------------------------------------------------------

WORDS = ["the", "function", "return", "a", "list", "of", "line", "naive", "cafe", "resume", "quoted", "text",
         ".", ",", "!", "?"]
TEXTS = ["The function returns a list of the lines.", "Naïve café, «quoted» RÉSUMÉ!", "x"]
PAIRS = ["A list?", "the text of a line", "Lines, functions and lists."]


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """A small uncased WordPiece vocabulary: bertjax's special tokens first, every letter whole and as ##."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + letters + ["##" + c for c in letters]
    tokens += [word for word in WORDS if word not in tokens]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_exported_tokenizer_feeds_the_exported_model(family, vocabulary, tmp_path):
    from bertjax.text import tokenizers

    cfg = bertjax_config(family)
    params = random_head(cfg, "classification")
    hf.save_hf_head(tmp_path, cfg, params, "classification", label_names=["x", "y", "z"], vocab_path=vocabulary)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = tokenizers.WordPieceTokenizer(vocabulary, lower_case=True)
    cls, sep = ours.cls_id, ours.sep_id
    singles, firsts, seconds = ours.encode(TEXTS), ours.encode(TEXTS), ours.encode(PAIRS)
    assert [theirs(t)["input_ids"] for t in TEXTS] == [[cls, *ids, sep] for ids in singles]
    pairs = [[cls, *a, sep, *b, sep] for a, b in zip(firsts, seconds)]
    assert [theirs(a, b)["input_ids"] for a, b in zip(TEXTS, PAIRS)] == pairs
    assert theirs.pad_token_id == ours.pad_id == 0 and theirs.mask_token_id == ours.mask_id
    # Straight into the model: token_type_ids only where it has two segment rows (ALBERT).
    batch = theirs(TEXTS, PAIRS, padding=True, return_tensors="pt")
    assert ("token_type_ids" in batch) == (cfg.type_vocab_size >= 2)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(model).__name__ == hf.FAMILIES[family].task_classes["classification"].architecture
    with torch.no_grad():
        logits = model(**batch).logits.numpy()
    input_ids = batch["input_ids"].numpy().astype(np.int32)
    # bertjax's own segment ids for the pairs (what its fine-tuning feeds): 1 from after the first [SEP].
    after_sep = np.cumsum(input_ids == sep, axis=1) - (input_ids == sep)
    mask = batch["attention_mask"].numpy().astype(np.int32)
    segment_ids = ((after_sep >= 1) * mask).astype(np.int32)
    inputs = dict(input_ids=input_ids, segment_ids=segment_ids, input_mask=mask)
    np.testing.assert_allclose(bertjax_logits(cfg, "classification", params, inputs), logits, rtol=0, atol=ATOL)
    assert model.config.id2label == {0: "x", 1: "y", 2: "z"}


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    from bertjax.data import demo
    from bertjax.text import tokenizers
    from bertjax.text import vocab_learning as vocabularies

    path = str(tmp_path_factory.mktemp("sp") / "sp.model")
    vocabularies.learn_sentencepiece_model(iter([s for doc in demo.demo_documents(100) for s in doc]), 90, path, True)
    return path, tokenizers.load_tokenizer("sentencepiece", path)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_sentencepiece_tokenizer_feeds_the_exported_model(family, sentencepiece, tmp_path):
    """As bertjax.export writes a SentencePiece model's tokenizer.json beside the family's class."""
    from bertjax.interop import hf_files, hf_tokenizer

    path, ours = sentencepiece
    cfg = bertjax_config(family)
    hf.save_hf_head(tmp_path, cfg, random_head(cfg, "classification"), "classification")
    hf_tokenizer.write_sentencepiece_tokenizer(ours, path, str(tmp_path), cfg.max_position_embeddings,
                                               hf_files.model_input_names(cfg))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = ["A list.", "Lines"]
    assert [theirs(t)["input_ids"] for t in texts] == [[ours.cls_id, *ids, ours.sep_id] for ids in ours.encode(texts)]
    batch = theirs(texts, texts[::-1], padding=True, return_tensors="pt")
    assert ("token_type_ids" in batch) == (cfg.type_vocab_size >= 2)
    with torch.no_grad():
        model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
        assert model(**batch).logits.shape == (2, 3)


def _tokenizer_error(directory) -> str:
    """What the one init-from says of a directory without a tokenizer bertjax reads."""
    with pytest.raises(ValueError) as error:
        init_from.resolve(str(directory))
    return str(error.value)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_directory_tokenizer_is_its_family_s_file_for_both_readers(family, vocabulary, sentencepiece, tmp_path):
    """init_from.resolve finds the tokenizer in a family's directory (and load hands it on), by
    the files the family reads: a WordPiece vocab.txt, for ALBERT also a SentencePiece spiece.model (byte-level
    BPE: tests/test_bpe.py); where there is none, one line saying what it looked for."""
    import bertjax

    torch.manual_seed(0)
    PRETRAINING_CLASSES[family](hf_config(family)).save_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text("{}")  # half a BPE tokenizer (no merges.txt): not one bertjax reads
    message = _tokenizer_error(tmp_path)
    looked_for = ("vocab.txt (WordPiece) or spiece.model (SentencePiece)" if family == "albert"
                  else "vocab.txt (WordPiece)")
    name = hf.FAMILIES[family].name
    assert message == (f"init_from={tmp_path} has {name} weights but no {looked_for}, "
                                          "tokenizer.json, or vocab.json and merges.txt (byte-level BPE), the "
                                          "tokenizers bertjax reads there: copy the tokenizer the model was "
                                          "trained with into it")
    if family == "albert":  # its SentencePiece model, with bertjax's special pieces
        path, ours = sentencepiece
        (tmp_path / "spiece.model").write_bytes(pathlib.Path(path).read_bytes())
        expected = init_from.TokenizerFiles("sentencepiece", str(tmp_path / "spiece.model"), True)
    else:
        (tmp_path / "vocab.txt").write_text(pathlib.Path(vocabulary).read_text(encoding="utf-8"))
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
        ours = None
        expected = init_from.TokenizerFiles("wordpiece", str(tmp_path / "vocab.txt"), False)
    start = init_from.resolve(str(tmp_path))
    assert start.tokenizer == init_from.load(start).tokenizer == expected
    if ours is not None:  # and bertjax.load tokenizes with it
        model = bertjax.load(tmp_path)
        ids = model.tokenize(["A list of lines."])["input_ids"][0].tolist()
        assert ids == [ours.cls_id, *ours.encode(["A list of lines."])[0], ours.sep_id]


# --------------------------------------------------------------------------------------------------
# Fine-tuning from a family's Hugging Face directory, and its export back to the family's class
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_fine_tuning_from_a_modernbert_directory_exports_to_its_class(vocabulary, tmp_path):
    import bertjax
    from bertjax.runs import exporting
    from bertjax.runs import finetuning
    from configs.finetune import common as finetune_configs

    torch.manual_seed(0)
    hf_model = randomize(transformers.ModernBertForMaskedLM(hf_config("modernbert")), seed=3)
    hf_model.save_pretrained(tmp_path / "modernbert")
    (tmp_path / "modernbert" / "vocab.txt").write_text(pathlib.Path(vocabulary).read_text(encoding="utf-8"))
    rng = np.random.default_rng(0)
    rows = [{"text": " ".join(rng.choice(WORDS[:12], size=5)), "label": "yes" if i % 2 else "no"} for i in range(48)]
    for name, part in (("train", rows[:32]), ("dev", rows[32:])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    config = finetune_configs.finetune_config("classification")
    config.train.init_from = str(tmp_path / "modernbert")
    config.data.update(max_seq_length=16, labels=("no", "yes"), train=str(tmp_path / "train.jsonl"),
                       validation=str(tmp_path / "dev.jsonl"))
    config.train.update(batch_size=8, epochs=1.0)
    config.logging.update(log_every=2, eval_batch_size=16)
    workdir = tmp_path / "run"
    summary = finetuning.finetune(config, str(workdir))
    assert summary["steps"] == 4 and "accuracy" in summary["best"]["metrics"]["validation"]
    lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert any(line.get("split") == "validation" and "accuracy" in line for line in lines)

    directory = exporting.export(str(workdir), str(tmp_path / "hf"), "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model, info = transformers.ModernBertForSequenceClassification.from_pretrained(directory, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.id2label == {0: "no", 1: "yes"}
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = model.eval()(**batch).logits.numpy()
    bert = bertjax.load(str(workdir))
    ids, mask = batch["input_ids"].numpy().astype(np.int32), batch["attention_mask"].numpy().astype(np.int32)
    ours = np.asarray(bert._task_logits(bert.params, ids, np.zeros_like(ids), mask))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=ATOL)
