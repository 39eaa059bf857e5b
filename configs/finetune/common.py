"""Defaults shared by the fine-tuning tasks: the BERT paper's recipe (Devlin et al. 2018, section 4 and
appendix A.3): batch 32, 3 epochs, learning rate from {2e-5, 3e-5, 5e-5} chosen on the dev set, 10% of
the steps linear warmup then linear decay, dropout 0.1, max sequence length 128. Each
configs/finetune/<task>.py names its task and writes out what differs.

The model's architecture comes from the checkpoint in train.init_from; the model section here only sets how
it computes and its dropout.
"""

import string

import ml_collections
from ml_collections import config_dict

from configs import common
from configs.distill import common as distill_configs

# The paper's grid for the fine-tuning learning rate (it also tried 4e-5 in appendix A.3).
PAPER_LEARNING_RATES = (2e-5, 3e-5, 5e-5)


def finetune_config(task: str) -> ml_collections.ConfigDict:
    base = common.base_config()
    config = ml_collections.ConfigDict()
    # A row of bertjax.tasks.registry.TASKS, or classification | regression | multiple_choice | span | tagging
    config.task = task
    # The older spelling of train.init_from, still read (with a line saying so).
    config.init_from = config_dict.placeholder(str)

    config.model = ml_collections.ConfigDict(dict(
        dtype="auto", attention_impl="auto", attention_block_size=512, word_embedding="auto", remat_policy="none",
        hidden_dropout_rate=0.1, attention_dropout_rate=0.1,
    ))

    config.data = ml_collections.ConfigDict(dict(
        max_seq_length=128,
        # Dev and test rows (and bertjax.load's predict) cut at this length instead: train short, evaluate long
        # (classification, regression, multiple choice, tagging). Unset: max_seq_length.
        eval_max_seq_length=config_dict.placeholder(int),
        tfds_data_dir=config_dict.placeholder(str),  # where TFDS keeps glue/* (default ~/tensorflow_datasets)
        # The user's own JSON-lines files (bertjax/tasks/readers.py); unset: the task's TFDS splits.
        train=config_dict.placeholder(str),
        validation=config_dict.placeholder(str),
        test=config_dict.placeholder(str),  # predicted for the submission / predictions file
        labels=config_dict.placeholder(tuple),  # class names, for task=classification: "('neg', 'pos')"
        num_choices=config_dict.placeholder(int),  # for task=multiple_choice
        # Training batches of several examples per row (classification, regression, tagging, rerank; docs/data.md
        # "Packing in fine-tuning"): a step still takes train.batch_size examples, in packed_rows rows, and
        # has their loss and gradients. Unset: on for those kinds, off for multiple choice, span and the
        # feature-based tagger, which cannot pack; True asks for it (an error where it cannot apply).
        packing=config_dict.placeholder(bool),
        max_sequences_per_row=16,  # K, the sequence slots of a packed row
        # Rows of a packed step (train.batch_size examples); unset: the most any step of the run needs.
        packed_rows=config_dict.placeholder(int),
    ))

    config.optimizer = base.optimizer
    config.optimizer.learning_rate = 2e-5
    config.optimizer.bias_correction = False  # the original BERT Adam, as in google-research/bert's run_classifier
    config.schedule = ml_collections.ConfigDict(dict(warmup_fraction=0.1, decay="linear", power=1.0))

    config.train = ml_collections.ConfigDict(dict(
        # A bertjax pretraining workdir or checkpoint, a fine-tuning one, or a Hugging Face BERT directory:
        # the same key as pretraining's.
        init_from=config_dict.placeholder(str),
        batch_size=32,
        # Each step's batch in this many microbatches (gradients averaged): the same update in less memory.
        grad_accum_steps=1,
        epochs=3.0,
        seed=0,  # the classifier's initialisation, the dropout masks and the order of the examples
        dropout_rng="threefry",
        prefetch_batches=2,
    ))
    # --config.sweep=True fine-tunes once per learning rate (WORKDIR/lr-<rate>) and reports the best dev score.
    config.sweep = False
    config.sweep_learning_rates = PAPER_LEARNING_RATES

    config.mesh = base.mesh
    config.logical_axis_rules = base.logical_axis_rules
    # Resumable checkpoints at the end of each epoch (the last kept); the best dev checkpoint in WORKDIR/best.
    config.checkpoint = ml_collections.ConfigDict(dict(keep=1, async_save=True))
    # eval_every=0: evaluate on the dev set at the end of every epoch.
    config.logging = ml_collections.ConfigDict(dict(log_every=50, eval_every=0, eval_batch_size=64,
                                                    profile_first_step=0, profile_steps=5))
    # Task distillation (Hinton et al. 2015): a teacher fine-tuned on this task (a fine-tuning workdir of the
    # same tokenizer) teaches the model being fine-tuned; loss = (1 - alpha) x the gold labels' loss +
    # alpha x T^2 x KL of the softened logits (regression: the squared difference of the values).
    config.distill = ml_collections.ConfigDict(dict(
        teacher=config_dict.placeholder(str),  # unset: plain fine-tuning
        temperature=2.0,
        alpha=0.5,  # the weight of the teacher's soft targets against the gold labels, in [0, 1]
        # The intermediate-layer losses (configs/distill/common.py's layer_losses: TinyBERT's embedding,
        # hidden and attention MSEs, BERT-PKD's alpha_pkd; all 0: none), added to the loss above, on unpacked
        # rows. A narrower student learns projections to the teacher's width (TinyBERT's W_e, W_h), saved
        # beside the optimizer state, never with the model; alpha_pkd needs the teacher's width.
        **distill_configs.layer_losses(),
        # bert: the student is the model train.init_from names, fine-tuned with the task's head. bilstm: Tang et
        # al. 2019's BiLSTM (bertjax/models/bilstm.py) over the teacher's vocabulary, from fresh weights
        # (train.init_from unset), for classification and regression; its soft loss is the squared distance of
        # the logits (temperature unread; the paper's BiLSTM-soft learns from it alone: alpha=1.0), its record
        # kept with its checkpoints, so that bertjax.load, export (--format=params) and the report read it.
        student="bert",
        bilstm_embedding_size=300,  # E, the word embeddings' width (the paper's word2vec's)
        bilstm_hidden_size=150,  # LSTM units each way
        bilstm_mlp_size=200,  # the ReLU layer between the pooled states and the logits
        bilstm_dropout_rate=0.0,  # on the pooled states, in training
        bilstm_learning_rate=1e-3,  # replaces optimizer.learning_rate: a student trained from scratch
        # The paper's augmentation (section 3.2; bertjax/tasks/augmentation.py): augment_copies copies of each
        # training example (n_iter; duplicates dropped; 0: none), each word masked with augment_p_mask, else
        # swapped with augment_p_pos for a word of its frequency band (of augment_band words; the paper's same-POS
        # word, without a tagger), then the copy cut to an n-gram (n in 1..augment_max_ngram) with augment_p_ng.
        # The teacher labels the copies; the gold loss reads the originals alone. Classification and regression;
        # data.packing off; epochs count every row.
        augment_copies=0,
        augment_p_mask=0.1,
        augment_p_pos=0.1,
        augment_p_ng=0.25,
        augment_max_ngram=5,
        augment_band=100,
    ))
    # BERT-of-Theseus (Xu et al. 2020; bertjax/compression/theseus.py): the predecessor's modules of N/M layers
    # are replaced at random by successor layers (started from its first M), which alone train; WORKDIR's model
    # is the successor (M layers), fine-tuned further by a run with --config.train.init_from=WORKDIR.
    config.theseus = ml_collections.ConfigDict(dict(
        predecessor=config_dict.placeholder(str),  # a workdir fine-tuned on this task (train.init_from then unset)
        successor_layers=6,  # M: divides the predecessor's layers (the paper: 12 -> 6)
        replace_rate=0.5,  # p, each module replaced with it at each step (the paper's constant rate)
        # The linear curriculum instead: p_t = min(1, replace_rate_start + replace_rate_slope x step); both or neither.
        replace_rate_start=config_dict.placeholder(float),
        replace_rate_slope=config_dict.placeholder(float),
    ))
    # python -m bertjax.prune (train.init_from: a model fine-tuned on this task; docs/performance.md, Pruning).
    config.prune = ml_collections.ConfigDict(dict(
        heads=0,  # attention heads kept in all, the least important removed (Michel et al. 2019); 0: keep all
        importance_batches=32,  # training batches (train.batch_size) the head importance is averaged over
        sparsity=0.0,  # fraction of the encoder layers' dense weights set to zero by magnitude (one global cut)
        # Fine-tuning epochs after pruning (the recipe's optimizer and schedule; pruned weights stay zero).
        recovery_epochs=0.0,
    ))
    return config


def span_config(task: str) -> ml_collections.ConfigDict:
    """Span question answering (SQuAD): the paper's v1.1 recipe (section 4.2: 3 epochs, 5e-5, batch 32)
    and google-research/bert run_squad.py's windows and decoding."""
    config = finetune_config(task)
    config.data.max_seq_length = 384
    config.data.max_query_length = 64  # question tokens kept
    config.data.doc_stride = 128  # tokens between the starts of a long context's windows
    config.data.squad_version = config_dict.placeholder(str)  # task=span: "v1.1" (default) or "v2.0"
    config.optimizer.learning_rate = 5e-5
    config.answers = ml_collections.ConfigDict(dict(
        n_best=20,  # start and end positions considered per window, and answers kept in the n-best file
        max_answer_length=30,  # tokens
    ))
    return config


def tagging_config(task: str) -> ml_collections.ConfigDict:
    """Token tagging (NER): the common recipe; feature_based.enabled=True trains the paper's
    feature-based tagger instead (section 5.3: the encoder frozen, its last four layers concatenated,
    a two-layer BiLSTM of 768 units each way, then the tag layer)."""
    config = finetune_config(task)
    config.optimizer.learning_rate = 5e-5
    config.feature_based = ml_collections.ConfigDict(dict(
        enabled=False, layers=(-1, -2, -3, -4), lstm_size=768, lstm_layers=2,
        # The BiLSTM and tag layer learn from scratch: this rate replaces optimizer.learning_rate when enabled.
        learning_rate=1e-3))
    return config


def contrastive_config(task: str = "contrastive") -> ml_collections.ConfigDict:
    """A sentence embedder trained on pairs (bertjax/tasks/kinds/contrastive.py): the common recipe with
    sentence-transformers' defaults for MultipleNegativesRankingLoss (scale 20, mean pooling)."""
    config = finetune_config(task)
    config.data.max_seq_length = 128  # passages (and both texts of scored pairs), [CLS] and [SEP] included
    config.data.max_query_length = 32  # queries of query / positive pairs
    # The texts of a step's pairs share rows (bertjax/tasks/contrastive_batches.py): the same loss and
    # gradient in fewer padded positions. data.packed_rows unset: the most any step needs.
    config.data.packing = True
    config.data.max_sequences_per_row = 16  # K: texts a packed row holds at most
    config.optimizer.learning_rate = 5e-5
    config.optimizer.bias_correction = True  # torch.optim.AdamW's, as sentence-transformers trains
    config.train.contrastive_microbatch = 0  # GradCache: pairs per cached microbatch; 0: the batch at once
    config.contrastive = ml_collections.ConfigDict(dict(
        # mnrl: {query, positive, negatives} rows, in-batch and hard negatives (InfoNCE); cosent or
        # cosine_mse: {text, text_pair, score} rows (cosine_mse: scores are target cosines in [-1, 1]);
        # distill_mse: {text, target_text (optional)} rows, the MSE to contrastive.teacher's embeddings;
        # margin_mse, kl: {query, positive, negatives, scores} rows, a teacher's score of the positive and of
        # each negative (MarginMSELoss, DistillKLDivLoss; on dot products).
        loss="mnrl",
        scale=20.0,  # the similarity's scale (1 / temperature): 20 is a temperature of 0.05
        symmetric=False,  # mnrl: add the passage -> query direction and average the two
        max_negatives=1,  # mnrl: hard negatives per row kept as candidates (its first ones); 0: in-batch only
        # Matryoshka: the loss summed over these widths, each embedding truncated and re-normalised; (): off.
        matryoshka_dims=(),
        matryoshka_weights=(),  # one per width; (): 1 each
        # sentence-transformers' modes: cls, mean, max, mean_sqrt_len_tokens, weightedmean, lasttoken
        pooling=("mean",),
        normalize=True,  # L2-normalised embeddings (what the checkpoint's embedding record says)
        dense_features=config_dict.placeholder(int),  # a Dense projection after pooling to this width; unset: none
        dense_activation="tanh",  # the Dense's activation (sentence-transformers' default): tanh | identity
        query_prompt="",  # prepended to every query (or text), e.g. "query: "
        passage_prompt="",  # prepended to every positive, negative (or text_pair), e.g. "passage: "
        # False: [CLS] and a prompt's tokens are left out of pooling (sentence-transformers'
        # Pooling(include_prompt=False)); the checkpoint's embedding record says so for embed and the export.
        include_prompt=True,
        # distill_mse: the model whose embeddings the student learns (any path bertjax.load reads); its
        # embeddings of each {text, target_text} row's target_text (default text) are computed once.
        teacher="",
        kl_temperature=2.0,  # kl: both softmaxes' temperature (SparseDistillKLDivLoss's 2; DistillKLDivLoss's is 1)
        # dense: pooled token states (the settings above). splade: each text a vector over the vocabulary,
        # max over its tokens of log(1 + ReLU(the model's own MLM logits)) (bertjax/models/sparse.py), from a
        # start with a masked-LM head; pooling, normalize, dense_* and matryoshka_* are the dense embedder's,
        # include_prompt stays True. Dev retrieval by dot product, with the active dimensions. colbert: a
        # vector per token (the colbert_* settings below).
        representation="dense",
        # splade: queries through the encoder; static: through a learned weight per vocabulary token (ones at
        # first), documents through the encoder (inference-free, sentence-transformers' SparseStaticEmbedding).
        splade_query="splade",
        splade_scale=1.0,  # mnrl's scale on dot products (SparseMultipleNegativesRankingLoss's 1)
        # FLOPS regularizer weights (SpladeLoss): sentence-transformers' documented 5e-5 / 3e-5; its
        # inference-free recipe (splade_query=static) uses 0 for queries and 3e-4 for documents.
        splade_lambda_query=5e-5,
        splade_lambda_document=3e-5,  # the positives and the hard negatives together
        # The lambdas grow as (step / warmup)^2 over this share of the steps, then hold
        # (SpladeRegularizerWeightSchedulerCallback's quadratic default, 1/3).
        splade_warmup_fraction=1 / 3,
        # Rows whose [rows, S, V] logits exist at a time (the backward recomputes them): memory, not results.
        splade_chunk_rows=8,
        # colbert (representation=colbert, bertjax/models/multivector.py): a vector per token, each projected to
        # colbert_dim and L2-normalised; a query scores a document by MaxSim (the sum over its tokens of the
        # best dot product with the document's). Losses mnrl, margin_mse, kl (sentence-transformers'
        # multi-vector ones; kl_temperature above, whose MultiVectorDistillKLDivLoss default is 1). Its rows are
        # its own (bertjax/tasks/multivector_texts.py): data.max_query_length and max_seq_length are not read;
        # query_prompt, passage_prompt, dense_*, matryoshka_* and symmetric stay unset. Packing packs its
        # documents; GradCache applies. Dev retrieval by MaxSim.
        colbert_dim=128,  # the projection's width (ColBERT's)
        colbert_markers="prompt",  # prompt: "[Q] " / "[D] " before the text; token: [unused0] / [unused1]; none
        colbert_query_length=32,  # every query this long: padded with [MASK] (colbert_expansion) or cut
        colbert_document_length=180,  # a document's most tokens
        colbert_expansion=True,  # a query's [MASK] padding is scored (ColBERT's query augmentation)
        colbert_attend_expansion=False,  # ... and attended to by the encoder
        # Words whose tokens a document does not score: string.punctuation, ColBERT's (each a vocabulary token).
        colbert_skiplist=tuple(string.punctuation),
        colbert_scale=1.0,  # mnrl's scale on MaxSim (MultiVectorMultipleNegativesRankingLoss's 1)
    ))
    return config


def rerank_config(task: str = "rerank") -> ml_collections.ConfigDict:
    """A reranker (cross-encoder) trained on each query's candidates (bertjax/tasks/kinds/rerank.py), with
    sentence-transformers' CrossEncoder defaults: learning rate 2e-5 with torch's AdamW bias correction."""
    config = finetune_config(task)
    config.data.max_seq_length = 256  # [CLS] query [SEP] passage [SEP]; the query is cut last
    config.optimizer.bias_correction = True
    config.train.batch_size = 16  # queries a step, each with its rerank.candidates pairs
    config.train.epochs = 1.0
    config.rerank = ml_collections.ConfigDict(dict(
        # bce: relevance labels in [0, 1], pair by pair; listnet, lambdaloss, ranknet: each query's list of
        # graded labels; margin_mse, kl: a teacher's scores (a "scores" list per row; margin_mse: the first
        # candidate is the positive). bertjax/models/rerank_losses.py has each formula.
        loss="bce",
        candidates=8,  # C: the most candidates a query has (the slots of each query in a step)
        k=config_dict.placeholder(int),  # lambdaloss, ranknet: pairs with either candidate in the top k; unset: all
        sigma=1.0,  # lambdaloss, ranknet: the score difference's scale inside the sigmoid
        mu=10.0,  # lambdaloss: the NDCG-Loss2++ weight of NDCG-Loss2 against LambdaRank
        temperature=1.0,  # kl: both softmaxes' temperature
    ))
    return config
