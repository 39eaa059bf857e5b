"""MTEB (Muennighoff et al. 2023; the mteb package, 2.26): a bertjax embedder as a model mteb.evaluate runs.

    encoder = Encoder(bertjax.load("runs/embedder"), name="my-org/embedder")
    evaluate(encoder, get_tasks(["SciFact", "STSBenchmark"]), "runs/mteb/mteb_results")  # task -> main score

`Encoder` has what mteb's EncoderProtocol asks for (encode over mteb's DataLoader, similarity,
similarity_pairwise, mteb_model_meta), so mteb takes it as it is. Its prompts are sentence-transformers'
as mteb's wrapper of a SentenceTransformer picks them: a prompt of the model named after the task
("SciFact-query", "SciFact"), its type ("Retrieval-query", "Retrieval") or the prompt type ("query"), else
a query gets the "query" prompt and a document its passage prompt, as embed's task="query" and
task="document" pick them (sentence-transformers' encode_query and encode_document), anything else the
model's default. A query is cut at the query length the model was trained with (task="query") whatever
its prompt.

mteb is an optional dependency (pip install bertjax[mteb]) and takes seconds to import: this module
imports it only when an encoder is made or tasks are fetched, never on `import bertjax`.
"""

import os

import numpy as np

from bertjax.compression import quantize

INSTALL = "pip install bertjax[mteb]"
QUERY, DOCUMENT = "query", "document"  # mteb's PromptType values, also embed's task names
EMBEDDER_PARAMS = ("bert", "dense")  # what embeds: the encoder and its Dense layer, not the pretraining heads


def require():
    """The mteb package, or one line saying how to install it."""
    try:
        import mteb  # an optional dependency, seconds to import: only where mteb runs
    except ImportError:
        raise ValueError(f"MTEB evaluation needs the mteb package: {INSTALL}") from None
    return mteb


def prompt_name(prompts: dict, task_name: str | None, task_type: str | None, prompt_type: str | None) -> str | None:
    """The name of the model's prompt for this task and prompt type ("query", "document" or None), as
    mteb's get_prompt_name chooses among a SentenceTransformer's prompts (a query's last choice "query").
    None: the one embed's task picks (a document's passage prompt), else the model's default, if any."""
    keys = [f"{task_name}-{prompt_type}" if prompt_type else None, task_name,
            f"{task_type}-{prompt_type}" if prompt_type else None, task_type, QUERY if prompt_type == QUERY else None]
    return next((key for key in keys if key and key in prompts), None)


def embedding_width(model) -> int:
    """The width of the model's sentence embeddings: its Dense layer's, else the pooled modes'."""
    record = model.embedding
    if record is None:
        return model.config.hidden_size  # mean pooling
    if record.dense is not None:
        return int(record.dense["features"])
    return model.config.hidden_size * len(record.modes)


class Encoder:
    """A bertjax.load'ed model (its LoadedBert) as mteb's EncoderProtocol: embeddings as `embed` makes
    them (pooling, Dense, normalisation, prompts), scored by the model's similarity (cosine or dot)."""

    def __init__(self, model, name: str | None = None, revision: str | None = None):
        mteb = require()
        config, record = model.config, model.embedding
        self.model = model
        self.prompts = dict(record.prompts) if record else {}
        self.similarity_name = record.similarity if record else "cosine"
        limit = config.max_position_embeddings - config.position_offset  # the tokens a text is cut to
        # What bertjax knows of the model. mteb files results by its name ("org/name") and revision, and
        # reads its scoring function as an enum.
        self.mteb_model_meta = mteb.models.ModelMeta.create_empty(overwrites=dict(
            name=name or f"bertjax/{os.path.basename(os.path.normpath(model.source or 'model'))}", revision=revision,
            n_parameters=quantize.parameter_count({k: v for k, v in model.params.items() if k in EMBEDDER_PARAMS}),
            embed_dim=embedding_width(model),
            max_tokens=min(record.max_seq_length or limit, limit) if record else limit,
            similarity_fn_name=mteb.models.model_meta.ScoringFunction(self.similarity_name), framework=["JAX"],
            modalities=["text"], model_type=["dense"]))
        self._similarities = mteb.similarity_functions

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
               **kwargs) -> np.ndarray:
        """The embeddings float32 [N, D] of every text of mteb's batches ({"text": [...]}), in order."""
        texts = [text for batch in inputs for text in batch["text"]]
        kind = getattr(prompt_type, "value", prompt_type)
        name = prompt_name(self.prompts, task_metadata.name, task_metadata.type, kind)
        batch_size = int(kwargs.get("batch_size") or 32)
        if not texts:
            return np.zeros((0, self.mteb_model_meta.embed_dim), np.float32)
        return self.model.embed(texts, prompt_name=name, batch_size=batch_size,
                                task=kind if kind in (QUERY, DOCUMENT) else None)

    def similarity(self, embeddings1, embeddings2):
        """[N1, N2] scores of every pair, by the model's similarity (mteb's own functions)."""
        if self.similarity_name == "dot":
            return self._similarities.dot_score(embeddings1, embeddings2)
        return self._similarities.cos_sim(embeddings1, embeddings2)

    def similarity_pairwise(self, embeddings1, embeddings2):
        """[N] scores of each row of embeddings1 with the same row of embeddings2."""
        if self.similarity_name == "dot":
            return self._similarities.pairwise_dot_score(embeddings1, embeddings2)
        return self._similarities.pairwise_cos_sim(embeddings1, embeddings2)


def get_tasks(tasks) -> list:
    """MTEB's tasks by name (mteb.get_task; an unknown name is one line, with mteb's suggestion), task
    objects of yours as they are."""
    mteb = require()
    chosen = []
    for task in tasks:
        if not isinstance(task, str):
            chosen.append(task)
            continue
        try:
            chosen.append(mteb.get_task(task))
        except KeyError as e:  # mteb's message: "KeyError: 'X' not found. Did you mean: 'Y'?"
            why = str(e.args[0] if e.args else f"{task!r} not found").removeprefix("KeyError: ")
            raise ValueError(f"--tasks: the MTEB task {why} (mteb.get_tasks() lists them)") from None
    return chosen


def evaluate(encoder: Encoder, tasks: list, results_dir: str, batch_size: int = 32) -> dict[str, dict]:
    """mteb.evaluate of the encoder on the tasks, every one run anew (mteb's own result files under
    results_dir): task name -> {"type", "main_score" (its name), "value" (mteb's mean over the
    evaluated splits and subsets), "scores" (mteb's, per split)}."""
    mteb = require()
    found = mteb.evaluate(encoder, tasks, cache=mteb.ResultCache(results_dir), overwrite_strategy="always",
                          encode_kwargs={"batch_size": int(batch_size)}, show_progress_bar=False)
    kinds = {task.metadata.name: task.metadata for task in tasks}
    return {result.task_name: {"type": kinds[result.task_name].type,
                               "main_score": kinds[result.task_name].main_score,
                               "value": float(result.get_score()), "scores": result.scores}
            for result in found.task_results}
