"""Sentence embeddings against sentence-transformers: its directories read by bertjax.load, embed equal to
SentenceTransformer.encode for every family (pooling modes and their concatenation, Dense, Normalize,
prompts pooled or not, truncation), bertjax models exported with --format=sentence-transformers (and a
pair classifier as a CrossEncoder), packed and bucketed rows equal to one text at a time, and the
directories bertjax cannot run refused in one line.

Each family's reference is a small random transformers encoder (every parameter, norms included, set
to noise) under sentence-transformers' own modules, saved by sentence-transformers itself; one is
rewritten in the layout of sentence-transformers 2.x (0_Transformer, pooling_mode_*_tokens booleans,
max_seq_length in sentence_bert_config.json, the Dense weights as pytorch_model.bin).
"""

import dataclasses
import json
import shutil
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from conftest import BPE_HELD_OUT, WORDS, copy_of
from test_family_heads import randomize  # every parameter noise, norm scales around 1
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling

import bertjax
from bertjax import embeddings
from bertjax.interop import sentence_transformers as st_directories
from bertjax.models import heads
from bertjax.runs import exporting
from bertjax.text import files
from bertjax.training import checkpoint
from bertjax.training.checkpoint_meta import CheckpointMeta, TaskRecord

ATOL = 1e-5
MAX_SEQ_LENGTH = 32
PROMPTS = {"query": "query: ", "passage": "passage: "}
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIAL + sorted(set(WORDS)) + ["query", "passage", ":", ".", ",", "##s", "##ed", "a", "b"]
H = 32

# family -> (the transformers encoder, its config, the embedder's modules: pooling modes, include_prompt,
# Dense (activation or None for no Dense, bias), Normalize, default prompt, sentence-transformers 2.x layout)
FAMILIES = {
    "bert": (transformers.BertModel, transformers.BertConfig(
        vocab_size=len(VOCAB), hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64), dict(modes=("cls", "mean"), include_prompt=False, activation=torch.nn.Tanh(),
                                          bias=True, normalize=True, default="query", legacy=False)),
    "roberta": (transformers.RobertaModel, transformers.RobertaConfig(
        vocab_size=len(VOCAB), hidden_size=H, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=66, type_vocab_size=1, pad_token_id=0, bos_token_id=2, eos_token_id=3,
        layer_norm_eps=1e-5), dict(modes=("max", "mean_sqrt_len_tokens"), include_prompt=True,
                                   activation=torch.nn.Identity(), bias=False, normalize=False, default=None,
                                   legacy=False)),
    "albert": (transformers.AlbertModel, transformers.AlbertConfig(
        vocab_size=len(VOCAB), embedding_size=16, hidden_size=H, num_hidden_layers=2, num_hidden_groups=1,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, hidden_act="gelu_new",
        pad_token_id=0), dict(modes=("cls", "mean", "weightedmean"), include_prompt=True, activation=torch.nn.Tanh(),
                              bias=True, normalize=True, default=None, legacy=True)),
    "modernbert": (transformers.ModernBertModel, transformers.ModernBertConfig(
        vocab_size=len(VOCAB), hidden_size=H, num_hidden_layers=3, num_attention_heads=2, intermediate_size=48,
        max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0,
        bos_token_id=2, cls_token_id=2, eos_token_id=3, sep_token_id=3), dict(
            modes=("lasttoken", "mean"), include_prompt=False, activation=torch.nn.Tanh(), bias=True,
            normalize=True, default="passage", legacy=False)),
}


def held_out_texts(n=14, seed=1) -> list[str]:
    """Texts of 0 to 45 words (so that some are cut at MAX_SEQ_LENGTH tokens), in no order of length."""
    rng = np.random.default_rng(seed)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(0, 46)))) for _ in range(n)]
    return texts + ["The river, old bridges.", ""]


def write_sentence_transformer(directory, family: str):
    """The family's encoder (random) under Pooling, Dense and Normalize, saved by sentence-transformers."""
    model_class, config, spec = FAMILIES[family]
    encoder_dir = directory.parent / f"{directory.name}-encoder"
    encoder_dir.mkdir()
    (encoder_dir / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    transformers.BertTokenizerFast(str(encoder_dir / "vocab.txt"), do_lower_case=True).save_pretrained(encoder_dir)
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    randomize(model_class(config)).save_pretrained(encoder_dir)
    modules = [Transformer(str(encoder_dir), max_seq_length=MAX_SEQ_LENGTH),
               Pooling(H, pooling_mode=spec["modes"], include_prompt=spec["include_prompt"])]
    if spec["activation"] is not None:
        torch.manual_seed(1)
        modules.append(Dense(H * len(spec["modes"]), 24, bias=spec["bias"], activation_function=spec["activation"]))
        with torch.no_grad():
            modules[-1].linear.weight.normal_(0, 0.3)
    if spec["normalize"]:
        modules.append(Normalize())
    st = SentenceTransformer(modules=modules, prompts=PROMPTS, default_prompt_name=spec["default"], device="cpu")
    st.save(str(directory))
    shutil.rmtree(encoder_dir)
    if spec["legacy"]:
        as_sentence_transformers_2(directory, spec["modes"])


LEGACY_POOLING = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens", "mean": "pooling_mode_mean_tokens",
                  "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                  "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}


def as_sentence_transformers_2(directory, modes):
    """The directory as sentence-transformers 2.x wrote it: the Transformer in 0_Transformer with its
    max_seq_length in sentence_bert_config.json, pooling_mode_*_tokens booleans (concatenated in their
    fixed order: `modes` must be in it), class paths under sentence_transformers.models, torch .bin weights."""
    transformer = directory / "0_Transformer"
    transformer.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.move(directory / name, transformer / name)
    (transformer / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MAX_SEQ_LENGTH,
                                                                        "do_lower_case": False}))
    (directory / "sentence_bert_config.json").unlink()
    modules = json.loads((directory / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
    (directory / "modules.json").write_text(json.dumps(modules))
    legacy = {"word_embedding_dimension": H, **{LEGACY_POOLING[m]: True for m in modes}}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(legacy))
    dense = directory / "2_Dense"
    torch.save(safetensors.torch.load_file(dense / "model.safetensors"), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()


@pytest.fixture(scope="module")
def directories(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentence-transformers")
    out = {}
    for family in FAMILIES:
        write_sentence_transformer(root / family, family)
        out[family] = root / family
    return out


@pytest.fixture(scope="module")
def loaded(directories):
    """family -> bertjax.load of its directory, loaded once (its compiled embedders too)."""
    cache = {}

    def load(family):
        if family not in cache:
            cache[family] = bertjax.load(directories[family])
        return cache[family]

    return load


def max_difference(a, b) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


def save_workdir(workdir, bert, vocab, task=None, embedding=None, kind="wordpiece"):
    """`bert` (a LoadedBert, or its parts) as a bertjax checkpoint with its vocabulary (a `kind` tokenizer's
    file: an uncased vocab.txt, or byte-level BPE's tokenizer.json), as runs write it."""
    workdir.mkdir()
    name = files.VOCAB_FILES[kind]
    shutil.copyfile(vocab, workdir / name)
    meta = CheckpointMeta.from_json({"step": 1, "model": bert.config.__dict__,
                                     "tokenizer": {"kind": kind, "path": name, "lower_case": kind == "wordpiece"}})
    saver = checkpoint.Checkpointer(str(workdir), every_steps=1, keep=1, async_save=False)
    saver.save(1, jax.device_get(bert.params), {"count": np.zeros((), np.int32)},
               meta.replace(task=task, embedding=embedding), force=True)
    saver.wait()
    saver.close()
    return workdir


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sentence_transformers_directory_embeds_as_sentence_transformers(family, directories, loaded, tmp_path):
    reference = SentenceTransformer(str(directories[family]), device="cpu")
    bert = loaded(family)
    spec = FAMILIES[family][2]
    assert bert.embedding.modes == spec["modes"] and bert.embedding.normalize == spec["normalize"]
    assert bert.embedding.max_seq_length == MAX_SEQ_LENGTH and bert.embedding.prompts["query"] == "query: "
    texts = held_out_texts()
    hows = {"default": dict(), "query": dict(prompt_name="query"), "passage": dict(prompt_name="passage"),
            "none": dict(prompt="")}
    expected = {name: reference.encode(texts, batch_size=4, **how) for name, how in hows.items()}
    differences = {name: max_difference(bert.embed(texts, batch_size=8, **how), expected[name])
                   for name, how in hows.items()}
    print(f"{family}: max |embedding difference| vs sentence-transformers {max(differences.values()):.2e}")
    assert max(differences.values()) < ATOL, differences

    # Exported from a bertjax checkpoint, the same model loads in sentence-transformers with the same embeddings.
    workdir = save_workdir(tmp_path / "run", bert, bert.vocab_path, embedding=bert.embedding)
    exported = exporting.export(str(workdir), str(tmp_path / "st"), "sentence-transformers")
    again = SentenceTransformer(exported, device="cpu")
    for name in ("default", "passage"):
        assert max_difference(again.encode(texts, **hows[name]), expected[name]) < ATOL
    assert max_difference(bertjax.load(workdir).embed(texts), expected["default"]) < ATOL


@pytest.mark.parametrize("name", ["roberta", "modernbert"])
def test_a_byte_level_bpe_sentence_transformer_embeds_and_exports_as_sentence_transformers(name, bpe_directories,
                                                                                          tmp_path):
    """conftest's byte-level BPE directories (a BPE the tokenizers library learned, beside a random RobertaModel
    or ModernBertModel) under Pooling, the prompts' tokens left out (a prompt ending in a space, which
    byte-level BPE merges into the next word: "query: The" -> query, :, ĠThe), and Normalize, saved by
    sentence-transformers: bertjax embeds as SentenceTransformer.encode with every prompt, and its
    sentence-transformers export loads back with the same embeddings."""
    modes = ("mean",) if name == "roberta" else ("cls", "mean")
    default = None if name == "roberta" else "query"
    st = SentenceTransformer(modules=[Transformer(str(bpe_directories[name]), max_seq_length=MAX_SEQ_LENGTH),
                                      Pooling(H, pooling_mode=modes, include_prompt=False), Normalize()],
                             prompts=PROMPTS, default_prompt_name=default, device="cpu")
    st.save(str(tmp_path / "st"))
    texts = BPE_HELD_OUT + held_out_texts(6)  # the longest cut at MAX_SEQ_LENGTH tokens
    reference = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    hows = {"default": dict(), "query": dict(prompt_name="query"), "passage": dict(prompt_name="passage"),
            "none": dict(prompt="")}
    expected = {how: reference.encode(texts, batch_size=4, **kwargs) for how, kwargs in hows.items()}
    bert = bertjax.load(tmp_path / "st")
    assert bert.tokenizer.kind == "bpe" and not bert.embedding.include_prompt
    differences = {how: max_difference(bert.embed(texts, batch_size=8, **kwargs), expected[how])
                   for how, kwargs in hows.items()}
    print(f"{name} (byte-level BPE): max |embedding difference| vs sentence-transformers "
          f"{max(differences.values()):.2e}")
    assert max(differences.values()) < ATOL, differences
    assert max_difference(expected["query"], expected["none"]) > 1e-2  # the prompt changes what is pooled
    workdir = save_workdir(tmp_path / "run", bert, bert.vocab_path, embedding=bert.embedding, kind="bpe")
    exported = SentenceTransformer(exporting.export(str(workdir), str(tmp_path / "export"), "sentence-transformers"),
                                   device="cpu")
    for how in ("default", "passage"):
        assert max_difference(exported.encode(texts, **hows[how]), expected[how]) < ATOL


@pytest.mark.parametrize("query_length", [6, 48])
def test_a_query_length_cuts_queries_as_encode_query(query_length, loaded, tmp_path):
    """A record's max_query_length (what contrastive training writes from data.max_query_length), shorter or
    longer than its max_seq_length (32): embed(task="query") embeds as sentence-transformers' encode_query on
    the export (the query prompt, the Transformer's query_length); the other texts keep max_seq_length. The
    record round-trips through the checkpoint, the export and bertjax.load of the export. Passages:
    embed(task="document") embeds as encode_document, with the "passage" prompt, not the empty "document"
    one sentence-transformers saved beside it (which its encode_document would take: the export writes the
    passage prompt under "document" too)."""
    bert = loaded("bert")
    record = dataclasses.replace(bert.embedding, max_query_length=query_length)
    assert record.prompts == {"query": "query: ", "document": "", "passage": "passage: "}
    workdir = save_workdir(tmp_path / "run", bert, bert.vocab_path, embedding=record)
    assert checkpoint.restore_params(str(workdir))[1].embedding == record
    exported = exporting.export(str(workdir), str(tmp_path / "st"), "sentence-transformers")
    assert json.loads((tmp_path / "st" / "sentence_bert_config.json").read_text())["query_length"] == query_length
    passage_prompts = {**record.prompts, "document": "passage: "}
    assert bertjax.load(exported).embedding == dataclasses.replace(record, prompts=passage_prompts)  # read back
    reference, model, texts = SentenceTransformer(exported, device="cpu"), bertjax.load(workdir), held_out_texts()
    queries = model.embed(texts, task="query")
    assert max_difference(queries, reference.encode_query(texts)) < ATOL
    passages = model.embed(texts, task="document")
    assert max_difference(passages, reference.encode_document(texts)) < ATOL
    assert max_difference(passages, reference.encode(texts, prompt_name="passage")) < ATOL
    assert max_difference(passages, model.embed(texts, prompt="")) > 1e-2  # the prompt is in the embeddings
    assert max_difference(queries, model.embed(texts, prompt_name="query")) > 1e-2  # cut elsewhere: other embeddings
    with pytest.raises(ValueError, match="task='passage': None, 'query' .* or 'document'"):
        model.embed(texts, task="passage")


def test_a_bertjax_workdir_exports_as_a_sentence_transformer(pretrained, tmp_path):
    """conftest's pretrained BERT (no embedding record: mean pooling, not normalised)."""
    exported = exporting.export(pretrained["workdir"], str(tmp_path / "st"), "sentence-transformers")
    reference = SentenceTransformer(exported, device="cpu")
    texts = ["The river flows north of the old city.", "A museum.", "", "Music " * 70]  # the last cut at 64
    bert = bertjax.load(pretrained["workdir"])
    assert bert.embedding is None
    difference = max_difference(bert.embed(texts), reference.encode(texts))
    print(f"pretrained workdir: max |embedding difference| vs sentence-transformers {difference:.2e}")
    assert difference < ATOL
    mean = bert.encode(texts[:1])
    np.testing.assert_allclose(bert.embed(texts[:1])[0], mean["sequence_output"][0].mean(0), rtol=0, atol=1e-6)
    assert "SentenceTransformer" in (tmp_path / "st" / "README.md").read_text()


def test_packed_and_bucketed_rows_embed_each_text_as_alone(loaded):
    bert = loaded("bert")
    texts = held_out_texts(24, seed=3)
    together = bert.embed(texts, batch_size=4)
    alone = np.concatenate([bert.embed([t]) for t in texts])
    assert max_difference(together, alone) < 1e-6
    # Other pooling and normalisation than the model's own, on the same rows.
    how = dict(pooling=["max", "weightedmean"], normalize=False)
    plain = bert.embed(texts, **how)
    assert max_difference(plain[:5], np.concatenate([bert.embed([t], **how) for t in texts[:5]])) < 1e-6
    assert max_difference(plain, together) > 1e-3
    with pytest.raises(ValueError, match="devices"):
        bert.embed(texts[:1], devices=[])


@pytest.mark.mesh
def test_batches_split_over_several_devices_embed_as_on_one(tmp_path):
    """devices: each batch's rows split over eight devices (padded to a multiple of eight: batches of 1,
    2 and 4 rows, one text a row and packed) give what one device gives."""
    assert jax.local_device_count() == 8
    write_sentence_transformer(tmp_path / "bert", "bert")
    bert = bertjax.load(tmp_path / "bert")
    texts = held_out_texts(21, seed=5)
    one = bert.embed(texts, batch_size=4, devices=jax.local_devices()[:1])
    assert max_difference(bert.embed(texts, batch_size=4), one) < 1e-6
    assert max_difference(bert.embed(texts[:3], batch_size=4), one[:3]) < 1e-6
    assert len(bert._replicas) == 1  # the params copied to the eight devices once, for every call


@pytest.mark.parametrize("tokens_per_batch", [None, 1024])
def test_the_plan_takes_every_text_once_in_few_shapes(tokens_per_batch):
    lengths = np.random.default_rng(0).integers(2, 300, size=1000)
    lengths[:600] = np.random.default_rng(1).integers(2, 40, size=600)  # many short texts: packed
    batches = embeddings.plan(lengths, 32, 300, tokens_per_batch)
    taken = np.concatenate([members[members >= 0] for members, _ in batches])
    assert sorted(taken.tolist()) == list(range(len(lengths)))
    widths = embeddings.buckets(300)
    assert widths == [16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 300]
    budget, short_batches = tokens_per_batch or 32 * 300, 0
    for members, width in batches:
        assert width in widths and members.shape[0] in (1, 2, 4, 8, 16, 32)
        # Within the budget (one row at least), and as many rows as fit it: twice as many would not.
        size = max(r for r in (1, 2, 4, 8, 16, 32) if r == 1 or r * width <= budget)
        assert members.shape[0] <= size
        short_batches += members.shape[0] < size
        row_tokens = np.where(members >= 0, lengths[np.maximum(members, 0)], 0).sum(axis=1)
        assert (row_tokens <= width).all()
        alone = members.shape[1] == 1
        assert alone or (lengths[members[members >= 0]] <= 64).all()
        if alone:  # the narrowest width that holds the batch's longest text: padded by at most a quarter
            longest = lengths[members[members >= 0]].max()
            assert widths.index(width) == 0 or widths[widths.index(width) - 1] < longest <= width < 1.25 * longest
    assert short_batches <= 2  # the last batch of one text a row and the last of packed rows
    assert len({(members.shape, width) for members, width in batches}) <= 16
    assert sum(members.shape[1] > 1 for members, _ in batches) >= 1


def task_workdir(directory, bert, kind: str, name: str, labels=()):
    """A fine-tuned-looking checkpoint: `bert`'s encoder under a random `kind` head, its logits far apart."""
    net = heads.network(kind, bert.config, len(labels) or None)
    params = nn.unbox(net.init(jax.random.key(1), **heads.dummy_inputs(kind, 1, 16))["params"])
    params = heads.with_pretrained_encoder(params, jax.device_get(bert.params))
    params["classifier"]["kernel"] = params["classifier"]["kernel"] * 50.0
    task = TaskRecord(name, kind, tuple(labels), None, 48)
    return save_workdir(directory, types.SimpleNamespace(config=bert.config, params=params), bert.vocab_path, task=task)


def test_a_pair_classifier_exports_as_a_cross_encoder(pretrained, tmp_path):
    bert = bertjax.load(pretrained["workdir"])
    pairs = [("The river flows north.", "A bridge crosses it."), ("Music", "The old museum was built in a century.")]
    for kind, labels in (("classification", ("no", "maybe", "yes")), ("regression", ())):
        workdir = task_workdir(tmp_path / kind, bert, kind, kind, labels)
        exported = exporting.export(str(workdir), str(tmp_path / f"{kind}-ce"), "sentence-transformers")
        reference = CrossEncoder(exported, device="cpu")
        ours = bertjax.load(workdir).predict([a for a, _ in pairs], [b for _, b in pairs])
        if kind == "classification":
            probabilities = np.array([[p["scores"][label] for label in labels] for p in ours])
            assert max_difference(reference.predict(pairs, apply_softmax=True), probabilities) < ATOL
        else:
            assert max_difference(reference.predict(pairs), np.array([p["score"] for p in ours])) < ATOL


def test_what_bertjax_cannot_run_is_one_line(directories, loaded, tmp_path):
    broken = copy_of(directories["bert"], tmp_path / "pooling")
    config = json.loads((broken / "1_Pooling" / "config.json").read_text())
    (broken / "1_Pooling" / "config.json").write_text(json.dumps({**config, "pooling_mode": ["mean", "avg"]}))
    with pytest.raises(ValueError, match=r"1_Pooling/config.json has pooling_mode \['avg'\]: bertjax pools with cls"):
        bertjax.load(broken)

    foreign = copy_of(directories["bert"], tmp_path / "modules")
    modules = json.loads((foreign / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_LayerNorm",
                       "type": "sentence_transformers.sentence_transformer.modules.layer_norm.LayerNorm"})
    for i, module in enumerate(modules):
        module["idx"] = i
    (foreign / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"names the module '.*LayerNorm': bertjax runs sentence-transformers' "
                                         r"Transformer, Pooling, Dense, Normalize only"):
        bertjax.load(foreign)

    bert = loaded("bert")
    with pytest.raises(ValueError, match=r"prompt_name='title': the model has the prompts document, passage, query"):
        bert.embed(["a text"], prompt_name="title")
    with pytest.raises(ValueError, match=r"pooling=\['mean'\]: the model's Dense layer takes the width of 2"):
        bert.embed(["a text"], pooling="mean")
    assert not st_directories.is_directory(str(tmp_path))


def test_what_exports_as_no_sentence_transformers_model_is_one_line(pretrained, tmp_path):
    bert = bertjax.load(pretrained["workdir"])
    for kind, name, labels, line in (
            ("span", "squad", (), "a fine-tuned span model is no SentenceTransformer nor CrossEncoder"),
            ("classification", "sst2", ("negative", "positive"), "sst2 classifies single sentences")):
        workdir = task_workdir(tmp_path / name, bert, kind, name, labels)
        with pytest.raises(ValueError, match=f"--format=sentence-transformers: {line}"):
            exporting.export(str(workdir), str(tmp_path / f"{name}-st"), "sentence-transformers")
        assert not list(tmp_path.glob(f"{name}-st*"))  # nothing written, not even half


def test_the_embedder_travels_in_a_params_export_and_runs_as_int8(directories, loaded, tmp_path):
    bert = loaded("bert")
    texts = held_out_texts(6)
    workdir = save_workdir(tmp_path / "run", bert, bert.vocab_path, embedding=bert.embedding)
    exported = bertjax.load(exporting.export(str(workdir), str(tmp_path / "params"), "params"))
    assert exported.embedding == bert.embedding
    assert max_difference(exported.embed(texts), bert.embed(texts)) < 1e-6
    int8 = bertjax.load(directories["bert"], quantize="int8").embed(texts)  # the Dense layer int8 too
    assert 0 < max_difference(int8, bert.embed(texts)) < 0.05
