"""Defaults shared by every model size. Each configs/<size>.py starts from base_config() and writes out
what is particular to it (the model shape, the batch, the recipe).

Sections: model (the network), data (corpus, tokenizer, pairing and masking), optimizer, schedule,
train (batch, steps, seeds, initialisation), mesh (device layout and the logical-axis rules),
checkpoint, logging. Any key can be overridden on the command line with --config.section.key=value;
an unknown key is an error.
"""

import ml_collections
from ml_collections import config_dict


def base_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()

    # --- The network (bertjax.models.config.BertConfig). Sizes are set by each size file.
    config.model = ml_collections.ConfigDict(
        dict(
            vocab_size=30522,  # WordPiece uncased vocabulary of the original release
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
            type_vocab_size=2,
            hidden_dropout_rate=0.1,
            attention_dropout_rate=0.1,
            layer_norm_eps=1e-12,
            initializer_range=0.02,
            # "auto" fields take models.config.PLATFORM_DEFAULTS for the platform the run is on.
            dtype="auto",  # compute: float32 on CPUs, bfloat16 on GPUs and TPUs; parameters stay float32
            param_dtype="float32",
            # auto: cuDNN flash attention on NVIDIA GPUs (trained without attention-probability dropout,
            # which it lacks: docs/performance.md), XLA elsewhere. "xla" keeps the dropout everywhere.
            attention_impl="auto",  # or xla | cudnn | splash | blockwise (memory linear in the sequence)
            attention_block_size=512,  # blockwise: query and key rows per tile of logits
            word_embedding="auto",  # gather | one_hot; auto: one_hot on TPUs, gather elsewhere
            # A key of models.config.REMAT_POLICIES: none | full | save_named | save_attention | ...
            remat_policy="none",
            # Unrolled layers run faster (a scanned stack copies every residual into an [L, ...] buffer)
            # and let the last block compute only the rows the heads read.
            # True: one compiled block for all layers, compile time independent of depth (large sets it).
            scan_layers=False,
            # Accelerator levers (docs/performance.md): the same network computed another way.
            fused_qkv=False,  # q, k, v as one matmul (the checkpoint keeps the three kernels)
            norm_kernel="xla",  # xla | pallas: post-LN residual + dropout + LayerNorm as one kernel
            matmul_dtype="default",  # default | fp8: dense matmuls in float8, delayed scaling (H100 and later)
            mlm_loss="logits",  # logits | chunked: the vocabulary projection fused with the loss, by chunks
            mlm_loss_chunk=8192,  # table rows per chunk of mlm_loss=chunked
            blockwise_from=0,  # rows this long or longer attend blockwise; 0: never (auto sets it on CPUs)
            pre_layer_norm=False,  # original BERT is post-LN
            # Family options (bertjax.models.config.BertConfig); these values are BERT's.
            position_embedding="learned",  # learned | rotary | none
            position_offset=0,  # first position row (RoBERTa: [PAD]'s id + 1)
            activation="gelu",  # gelu | gelu_tanh | geglu
            norm_placement="post",  # post | pre (ModernBERT: embedding norm, none before layer 0, final norm)
            use_bias=True,
            norm="layernorm",  # layernorm | rmsnorm
            rotary_theta=10000.0,
            global_rotary_theta=0.0,  # the global layers' RoPE base; 0: rotary_theta
            local_attention_window=0,  # total width of the sliding window of local layers; 0: none
            global_attention_every=1,  # layer i global when i % n == 0
            global_cls=False,  # [CLS] sees past the local layers' window and is seen past it (Longformer)
            embedding_size=0,  # ALBERT's E; 0: hidden_size
            num_hidden_groups=0,  # ALBERT's shared groups; 0: one per layer
            pooler="tanh",  # tanh (dense, tanh on [CLS]) | gelu_norm (ModernBERT's head: dense, GELU, norm)
        )
    )

    # --- Input pipeline (bertjax/data): documents -> examples by objective -> dynamic masking.
    config.data = ml_collections.ConfigDict(
        dict(
            # demo | text | tfds | parquet | hf_datasets | prepared | synthetic (random batches, no TensorFlow)
            source="demo",
            # comma-separated globs of files, local or gs://: text files (source=text), Parquet (source=parquet)
            input_pattern=config_dict.placeholder(str),
            text_format="sentences",  # sentences (one per line, blank line between documents) | documents
            #                           (one per line) | jsonl | document_per_file
            text_field="text",  # the JSON field of text_format=jsonl
            sentence_splitter="default",  # default (English rules) | multilingual (needs pip install blingfire)
            tfds_name=config_dict.placeholder(str),  # e.g. "wikipedia/20230601.en", source=tfds
            tfds_split="train",
            tfds_text_feature="text",
            tfds_data_dir=config_dict.placeholder(str),
            # Tables (source=parquet | hf_datasets): one row per document. text_column is split into sentences;
            # sentences_column, when set, is a list<string> column taken as the sentences (no splitter).
            text_column="text",
            sentences_column=config_dict.placeholder(str),
            hf_dataset_path=config_dict.placeholder(str),  # a datasets save_to_disk directory, source=hf_datasets
            hf_dataset_name=config_dict.placeholder(str),  # or a dataset name the datasets cache holds
            hf_dataset_split="train",  # the split of a DatasetDict directory, or of hf_dataset_name
            # Several sources by weight, e.g. (dict(source="parquet", input_pattern="web/*.parquet", weight=0.8),
            # dict(source="text", input_pattern="books/*.txt", weight=0.2)): each entry sets its source's keys
            # over this section's; the recipe below is shared. (): no mixture, data.source alone.
            mixture=(),
            mixture_block_size=100,  # every block of this many elements holds each source's weighted count
            prepared_dir=config_dict.placeholder(str),  # written by python -m bertjax.prepare
            eval_fraction=0.01,  # share of documents held out (chosen by a stable hash of their text)
            tokenizer="wordpiece",  # wordpiece | sentencepiece
            vocab_path=config_dict.placeholder(str),  # unset: learned from the corpus, cached in the workdir
            vocab_size=30522,  # size of a learned vocabulary
            lower_case=True,
            max_seq_length=128,
            max_predictions_per_seq=20,  # 20 at seq 128, 80 at seq 512 (MLPerf: 76); at least rate x seq
            # nsp: BERT's next-sentence pairs | sop: ALBERT's sentence order (two consecutive segments of
            # one document, half swapped) | none: RoBERTa's FULL-SENTENCES rows, masked LM only.
            objective="nsp",
            # Share of each example's tokens to predict: BERT 0.15, ModernBERT 0.3. (The older key
            # masked_lm_prob, where a config still sets it, wins over this one.)
            mask_rate=0.15,
            eval_mask_rate=config_dict.placeholder(float),  # held-out batches; unset: mask_rate
            mask_token_fraction=0.8,  # of the predicted positions: shown as [MASK]
            random_token_fraction=0.1,  # shown as a random token; the rest (0.1) stay unchanged
            short_seq_prob=0.1,  # nsp and sop: share of pairs with a shorter random target length
            # Which positions are masked together, within the same budget of tokens: token (BERT) |
            # whole_word (all pieces of a word) | span (SpanBERT: whole-word spans, geometric lengths) |
            # ngram (ALBERT: n-grams of whole words, p(n) ~ 1/n) | units (lexicon phrases and entities, or
            # the words a segmenter finds in scripts written without spaces). docs/data.md, "Masking".
            masking="token",
            whole_word_masking=False,  # older form of masking="whole_word"
            # Held-out batches' strategy; unset: masking. Strategies compared on one held-out set: token.
            eval_masking=config_dict.placeholder(str),
            # Phases of the training rate by step, e.g. ((0, 0.3), (100000, 0.15), (150000, 0.05)) (mmBERT);
            # (): data.mask_rate throughout. Held-out batches keep eval_mask_rate (unset: mask_rate).
            mask_rate_schedule=(),
            span_p=0.2,  # span: geometric parameter of a span's length in words (SpanBERT 0.2)
            span_max_words=10,  # span: lengths clipped at this many words (SpanBERT 10: mean 3.8)
            ngram_max_n=3,  # ngram: n = 1..ngram_max_n words (ALBERT 3: shares 6/11, 3/11, 2/11)
            units_lexicon=config_dict.placeholder(str),  # units: a file, one phrase or entity a line
            word_segmenter="none",  # units: none | jieba (Chinese; pip install jieba)
            # Packing (docs/data.md): several examples share a row of max_seq_length (nsp, sop; "none" rows
            # are full already and stay one sequence each). Rows then hold about 99% real tokens instead of
            # 76% (demo corpus, seq 128); train.batch_size counts rows. False: one padded example per row.
            packing=True,
            # K, sequences a packed row may hold: the [B, K] sentence slots. 8 leaves seq 128 unconstrained
            # (rows use at most 5); seq 512 wants 16 (the seq-512 recipe sets it).
            max_sequences_per_row=8,
            packing_window=1000,  # consecutive examples the packer fits into rows at once
            seed=0,  # pairs and masks: the batch at step N is a function of (corpus, config, seed, N)
        )
    )

    # --- Optimizer: BERT's Adam with decoupled weight decay (not on LayerNorm or biases).
    config.optimizer = ml_collections.ConfigDict(
        dict(
            # adamw | lamb | decoupled_adamw (weight decay scaled by lr / peak, composer's) | stable_adamw
            # (StableAdamW: lr divided per tensor by max(1, RMS of g / sqrt(v)), optimi's) |
            # decoupled_stable_adamw (both: ModernBERT's)
            name="adamw",
            learning_rate=1e-4,
            b1=0.9,
            b2=0.999,
            eps=1e-6,
            weight_decay=0.01,
            bias_correction=False,  # the original BERT Adam has none; stable_adamw always corrects (set True)
            clip_norm=1.0,  # global-norm clipping
        )
    )

    # --- Learning-rate schedule: linear warmup, then decay to zero at train.num_steps.
    config.schedule = ml_collections.ConfigDict(
        dict(
            warmup_steps=10000,
            decay="linear",  # linear | poly | wsd
            power=1.0,  # exponent of the poly decay (NVIDIA's LAMB recipe uses 0.5)
            decay_steps=0,  # wsd (warmup-stable-decay): the last steps, where lr falls to 0 by 1 - sqrt
        )
    )

    config.train = ml_collections.ConfigDict(
        dict(
            batch_size=256,  # global, in sequences
            grad_accum_steps=1,  # microbatches per step; batch_size must divide by it
            # Batch-size warmup (ModernBERT): the batch grows from batch_warmup_start sequences to batch_size
            # over the first batch_warmup_steps steps, in whole microbatches of batch_size / grad_accum_steps
            # (the microbatch fixed, their number per step growing; bertjax/training/batch_warmup.py). The
            # learning-rate schedule counts steps, whatever their size. 0: off, every step batch_size.
            batch_warmup_start=0,
            batch_warmup_steps=0,
            num_steps=1_000_000,
            seed=0,
            init_from=config_dict.placeholder(str),  # bertjax checkpoint or Hugging Face directory
            # A new phase of a run (docs/design.md, "Phases"): init_from's parameters, and with
            # init_from_optimizer=True its optimizer state too (Adam moments and their count; the same kind
            # of optimizer), the step and the learning-rate schedule restarting at 0. The sequence length,
            # RoPE thetas, rate, schedule and batch may all change; the start says every change in one line.
            init_from_optimizer=False,
            # A learned position table of another length than init_from's: none (an error) | copy (its
            # rows tiled over the new table, as RoBERTa's were for Longformer). Rotary models have no table.
            extend_positions="none",
            # The recipe this one continues (e.g. "configs/modernbert_base.py:pretrain"): its run's workdir
            # must then be given as train.init_from. "": none.
            continues="",
            # Dropout bits: threefry (the same masks on every mesh) | rbg (the hardware generator).
            dropout_rng="threefry",
            prefetch_batches=2,  # batches made and put on the devices ahead of the step
        )
    )

    # --- Device mesh. -1 takes the devices the other axes leave.
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    # The one table from the model's logical axis names to mesh axes. Names not listed are replicated.
    config.logical_axis_rules = [
        ("batch", ("data", "fsdp")),
        ("vocab", "tensor"),
        ("heads", "tensor"),
        ("mlp", "tensor"),
        ("embed", "fsdp"),
    ]

    config.checkpoint = ml_collections.ConfigDict(dict(every_steps=1000, keep=3, async_save=True))

    # profile_first_step > 0 writes a jax.profiler trace of profile_steps steps to WORKDIR/profile.
    config.logging = ml_collections.ConfigDict(dict(log_every=100, eval_every=1000, eval_batches=20,
                                                    profile_first_step=0, profile_steps=5))
    return config


def electra_section(*, generator_hidden_size: int, generator_num_layers: int, generator_num_heads: int,
                    generator_intermediate_size: int, discriminator_weight: float) -> ml_collections.ConfigDict:
    """ELECTRA's section (Clark et al. 2020): its presence makes pretraining ELECTRA's. The generator is a
    masked LM of its own width and depth sharing the discriminator's (model's) embeddings; the loss is
    its masked LM + discriminator_weight x the discriminator's replaced-token cross-entropy."""
    return ml_collections.ConfigDict(dict(
        generator_hidden_size=generator_hidden_size,  # 1/4 (Small, Large) to 1/3 (Base) of model.hidden_size
        generator_num_layers=generator_num_layers,
        generator_num_heads=generator_num_heads,
        generator_intermediate_size=generator_intermediate_size,
        discriminator_weight=discriminator_weight,  # the paper's lambda: 50
    ))


# The paper's pretraining (Devlin et al. 2018), the same for BERT-Base and BERT-Large:
# {recipe: {config section: values}}. Adam b1/b2/eps/weight decay/clipping are base_config()'s.
DEVLIN_RECIPES = {
    # 900,000 steps at seq 128: lr 1e-4, 10,000 warmup steps then linear decay, batch 256.
    "adam": dict(
        optimizer=dict(name="adamw", learning_rate=1e-4, bias_correction=False),
        schedule=dict(warmup_steps=10000, decay="linear", power=1.0),
        train=dict(batch_size=256, num_steps=900_000),
    ),
    # The last 100,000 of the paper's 1,000,000 steps, at seq 512: the same decay, continued (1e-5 to 0).
    "adam_seq512": dict(
        optimizer=dict(name="adamw", learning_rate=1e-5, bias_correction=False),
        schedule=dict(warmup_steps=0, decay="linear", power=1.0),
        train=dict(batch_size=256, num_steps=100_000),
        data=dict(max_seq_length=512, max_predictions_per_seq=80, max_sequences_per_row=16),
    ),
}


def apply_recipe(config: ml_collections.ConfigDict, recipes: dict, recipe: str, config_file: str):
    """Set the sections of `recipes[recipe]` on config; an unknown recipe name is an error."""
    if recipe not in recipes:
        raise ValueError(f"unknown recipe {recipe!r} for {config_file}: choose one of {', '.join(recipes)}")
    for section, values in recipes[recipe].items():
        config[section].update(values)
    return config
