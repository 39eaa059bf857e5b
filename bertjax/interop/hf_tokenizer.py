"""A bertjax SentencePiece model (or WordPiece vocabulary) as a Hugging Face `tokenizer.json` (the
`tokenizers` library's format), so that AutoTokenizer loads an exported model with the ids bertjax gives.

The unigram pieces and scores, the model's own normalisation (its precompiled NFKC / case-folding map)
and SentencePiece's whitespace rules (extra spaces removed, "▁" before every word) become the
tokenizers pipeline; [CLS] A [SEP] (B [SEP]) is its post-processor. A BERT directory's WordPiece needs
none of this (transformers builds BertTokenizer from vocab.txt itself), but AutoTokenizer for ModernBERT's
model_type reads tokenizer.json only: family directories get the same WordPiece pipeline as tokenizer.json.

Byte-level BPE (RoBERTa, ModernBERT) is read from the model's own tokenizer.json (BPETokenizer,
bertjax/text/tokenizers.py) and written back as it is; RoBERTa's older vocab.json and merges.txt become the
tokenizer.json that transformers builds from them.
"""

import json
import os


def write_wordpiece_tokenizer(vocab_path: str, lower_case: bool, directory: str) -> None:
    """tokenizer.json of a WordPiece vocab.txt: what transformers' BertTokenizer builds from it (BERT's
    normaliser and pre-tokenizer, ## pieces, [CLS] A [SEP] (B [SEP]) with segments 0 and 1)."""
    # Here, not at the top: only writing a tokenizer.json needs the tokenizers library, and interop is on the
    # paths that read no tokenizer (the benchmark on accelerator hosts).
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    with open(vocab_path, encoding="utf-8") as f:  # text mode: lines end at \n, \r\n or \r, as for transformers
        vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
    # 100 characters a word at most, as BertTokenizer (and bertjax.text.tokenizers.MAX_CHARS_PER_WORD).
    hf = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    hf.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                               lowercase=lower_case)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    hf.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    hf.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])  # in the vocabulary: ids kept
    hf.save(os.path.join(directory, "tokenizer.json"))


def model_type(path: str) -> str:
    """A tokenizer.json's model ("WordPiece", "BPE", "Unigram", ...); one line where it is none bertjax reads."""
    try:
        with open(path, encoding="utf-8") as f:
            found = (json.load(f).get("model") or {}).get("type")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if found not in ("WordPiece", "BPE", "Unigram"):
        raise ValueError(f"{path} is a {found} tokenizer: bertjax reads tokenizer.json files whose model is BPE "
                         "(byte-level), WordPiece or Unigram (with its spiece.model)")
    return found


def roberta_tokenizer_json(vocab_path: str, merges_path: str, settings: dict) -> str:
    """The tokenizer.json (as text) transformers builds from RoBERTa's vocab.json and merges.txt: byte-level
    BPE, <s> A </s></s> B </s>; settings: the directory's tokenizer_config.json (its special tokens'
    names and add_prefix_space, RoBERTa's defaults where it has none)."""
    # Here, not at the top: only reading these older files needs the tokenizers library (see above).
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    def name(role: str, default: str) -> str:
        value = settings.get(role, default)
        return value["content"] if isinstance(value, dict) else str(value)

    try:
        bpe = models.BPE.from_file(vocab_path, merges_path)
    except Exception as e:  # the library's own error types name no file
        raise ValueError(f"{vocab_path} and {merges_path} are not a BPE vocabulary and its merges ({e})") from None
    hf = Tokenizer(bpe)
    prefix_space = bool(settings.get("add_prefix_space", False))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    hf.decoder = decoders.ByteLevel()
    cls, sep = name("cls_token", "<s>"), name("sep_token", "</s>")
    vocab = hf.get_vocab()
    roles = [cls, sep, name("pad_token", "<pad>"), name("unk_token", "<unk>"), name("mask_token", "<mask>")]
    missing = [token for token in roles if token not in vocab]
    if missing:
        raise ValueError(f"{vocab_path} lacks the special tokens {' '.join(missing)} that its tokenizer_config.json "
                         "(or RoBERTa's defaults) name")
    hf.post_processor = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]), trim_offsets=True,
                                                     add_prefix_space=prefix_space)
    hf.add_special_tokens([AddedToken(t, special=True) for t in dict.fromkeys(roles)])  # in the vocabulary: ids kept
    return hf.to_str()


def read_wordpiece_tokenizer(path: str) -> tuple[list[str], bool]:
    """A tokenizer.json's WordPiece vocabulary (tokens in id order) and whether it lower-cases, where it is
    BERT's pipeline (BertNormalizer, BertPreTokenizer, ## pieces), the one bertjax's WordPiece computes."""
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    model, normalizer = spec.get("model") or {}, spec.get("normalizer") or {}
    pre_tokenizer = (spec.get("pre_tokenizer") or {}).get("type")
    if (model.get("type") != "WordPiece" or normalizer.get("type") != "BertNormalizer"
            or pre_tokenizer != "BertPreTokenizer" or model.get("continuing_subword_prefix", "##") != "##"):
        raise ValueError(f"{path} is a {model.get('type')} tokenizer ({normalizer.get('type')}, {pre_tokenizer}): "
                         "bertjax reads BERT's WordPiece (vocab.txt) or SentencePiece (spiece.model) tokenizers")
    lower_case = bool(normalizer.get("lowercase", True))
    if normalizer.get("strip_accents") not in (None, lower_case):  # bertjax strips accents when it lower-cases
        raise ValueError(f"{path}: strip_accents={normalizer['strip_accents']} with lowercase={lower_case}, which "
                         "bertjax's WordPiece does not do (it strips accents exactly when it lower-cases)")
    vocab = model["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in tokens] != list(range(len(tokens))):
        raise ValueError(f"{path}: its WordPiece ids are not 0 .. {len(tokens) - 1}")
    return tokens, lower_case


def write_sentencepiece_tokenizer(tokenizer, model_path: str, directory: str, model_max_length: int,
                                  model_input_names: list[str]) -> None:
    """tokenizer.json and tokenizer_config.json for `tokenizer` (a SentencePieceTokenizer) in `directory`;
    model_input_names: what the model's forward takes (hf_files.model_input_names)."""
    try:
        # Only writing a tokenizer.json needs the tokenizers library (see write_wordpiece_tokenizer).
        from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    except ImportError:
        raise ValueError("exporting a SentencePiece tokenizer to Hugging Face needs the `tokenizers` package: "
                         "pip install tokenizers") from None
    # Here, not at the top: generated protobuf code checks the installed protobuf's version when imported,
    # and interop (this module through hf_files) is on every path, the accelerator hosts' benchmark's too.
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(model_path, "rb") as f:
        proto.ParseFromString(f.read())
    if proto.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
        raise ValueError(f"{model_path}: only unigram SentencePiece models export to Hugging Face "
                         "(bertjax.text.vocab_learning trains unigram ones)")
    pieces = [(p.piece, p.score) for p in proto.pieces]
    hf = Tokenizer(models.Unigram(pieces, unk_id=tokenizer.unk_id, byte_fallback=False))
    steps = []
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    if proto.normalizer_spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip()]
    hf.normalizer = normalizers.Sequence(steps)
    prepend = "always" if proto.normalizer_spec.add_dummy_prefix else "never"
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    hf.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend)
    cls, sep = "[CLS]", "[SEP]"
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.cls_id), (sep, tokenizer.sep_id)])
    hf.add_special_tokens(["[PAD]", "[UNK]", cls, sep, "[MASK]"])  # already in the vocabulary: ids kept
    hf.save(os.path.join(directory, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model_max_length,
              "unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": cls, "sep_token": sep, "mask_token": "[MASK]",
              "model_input_names": list(model_input_names)}
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
