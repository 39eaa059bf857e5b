"""python -m bertjax.summary counts the parameters the Hugging Face class of each family counts.

bertjax's count comes from jax.eval_shape, HF's from the transformers class built on the meta device
(no memory, no initialisation arithmetic), so the large configs cost no more than the base ones.
"""


import flax
import flax.linen as nn
import pytest
import torch
import transformers

from bertjax.bench import model_summary
from bertjax.interop import hf
from bertjax.models import bert
from bertjax.models.config import BertConfig
from configs import albert_base, base, large, mobilebert, modernbert_base, modernbert_large, roberta_base

# bertjax keeps BertForPreTraining's pooler and next-sentence head in every family (the sentence task of
# configs whose objective has none is simply not trained); the HF class lacks both where it is a
# masked-LM class: RoBERTa (tanh pooler H -> H and head H -> 2, with biases) and ModernBERT (no biases;
# its pooler is model.pooler="gelu_norm", dense + GELU + a norm, as its HF task heads compute it).
NO_POOLER_NOR_SENTENCE_HEAD = ("bert/pooler", "nsp_head/")
CASES = [
    (base, "BertForPreTraining", ()),
    (large, "BertForPreTraining", ()),
    (roberta_base, "RobertaForMaskedLM", NO_POOLER_NOR_SENTENCE_HEAD),
    (albert_base, "AlbertForPreTraining", ()),
    (modernbert_base, "ModernBertForMaskedLM", NO_POOLER_NOR_SENTENCE_HEAD),
    (modernbert_large, "ModernBertForMaskedLM", NO_POOLER_NOR_SENTENCE_HEAD),
    # The published MobileBERT: no pooler on either side (classifier_activation false, model.pooler="first").
    (mobilebert, "MobileBertForPreTraining", ()),
]


def hf_parameter_count(cfg: BertConfig) -> tuple[str, int]:
    """The transformers class of the config, built on the meta device, and its parameters() count (a tied
    tensor is one Parameter, counted once)."""
    hf_config = hf.config_to_hf(cfg)  # its family's
    model_type = hf_config["model_type"]
    hf_config = {k: v for k, v in hf_config.items() if k not in ("model_type", "dtype", "torch_dtype")}
    config = transformers.AutoConfig.for_model(model_type, **hf_config)
    architecture = hf_config["architectures"][0]
    with torch.device("meta"):
        model = getattr(transformers, architecture)(config)
    return architecture, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("module, architecture, lacks", CASES, ids=lambda x: getattr(x, "__name__", "")[8:] or None)
def test_summary_counts_what_the_hf_class_counts(module, architecture, lacks):
    cfg = BertConfig.from_dict(module.get_config().model, platform="cpu")
    hf_architecture, hf_count = hf_parameter_count(cfg)
    assert hf_architecture == architecture
    got_architecture, count, lacking = model_summary.hf_class_count(cfg)
    assert got_architecture == architecture
    assert count == hf_count
    params = flax.traverse_util.flatten_dict(nn.unbox(model_summary.abstract_params(cfg)), sep="/")
    expected = {path: x.size for path, x in params.items() if lacks and path.startswith(lacks)}
    assert sorted(lacking) == sorted(expected)
    assert bert.count_params(params) == hf_count + sum(expected.values())
    if architecture == "RobertaForMaskedLM":  # pooler H*H + H, head 2*H + 2
        assert sum(expected.values()) == 768 * 768 + 768 + 2 * 768 + 2


def test_summary_prints_both_counts_where_they_differ(capsys):
    model_summary.print_summary(roberta_base.get_config())
    out = capsys.readouterr().out
    assert "parameters: 125,288,795 in all (125.3M)" in out
    assert "as Hugging Face RobertaForMaskedLM counts them: 124,696,665 (124.7M), without bertjax's" in out
    model_summary.print_summary(albert_base.get_config())
    assert "as Hugging Face AlbertForPreTraining counts them: the same" in capsys.readouterr().out


def test_memory_of_the_compiled_step_grows_with_the_batch_not_the_state():
    from configs import tiny

    def memory(batch_size):
        config = tiny.get_config()
        config.data.max_seq_length, config.train.batch_size = 32, batch_size
        return model_summary.step_memory(config)

    small, large = memory(2), memory(8)
    assert small["params"] == large["params"] == 4 * 1_552_898  # float32
    assert small["opt_state"] == large["opt_state"] > 2 * small["params"]  # Adam's two moments, and its count
    # The gradients are temporaries of any batch; the activations grow with it.
    assert large["batch"] == 4 * small["batch"] and large["temporaries"] > small["temporaries"] > small["params"]
    line = model_summary.memory_line(tiny.get_config(), large)
    assert line.startswith("train step on one cpu device, batch 32 x 128") and "activations and temporaries" in line
