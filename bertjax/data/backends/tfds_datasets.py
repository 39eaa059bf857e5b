"""data.source=tfds: any TensorFlow Datasets dataset with a text feature (wikipedia/20230601.en, c4/en),
one document per example. TensorFlow and TFDS are imported when the dataset is loaded: only this source
needs them, and they are slow to load.

Hosts read the whole split; prepare's output shard k reads the k-th of N even splits of it.
"""

from collections.abc import Callable, Iterable, Iterator

from bertjax.data.backends.backend import Backend, BadRows, require_documents
from bertjax.text import tf_cpu
from bertjax.text.sentences import split_sentences


def read_tfds_documents(
    name: str,
    split: str,
    text_feature: str,
    data_dir: str | None = None,
    *,
    split_text: Callable[[str], list[str]] = split_sentences,
) -> Iterator[list[str]]:
    """One document per example of a TFDS dataset, from its string feature `text_feature`.

    Every line break in an article is a paragraph break, unlike in split_sentences: TFDS text
    datasets are not hard-wrapped, and c4 puts one paragraph per line, so joining lines would glue a
    heading or a list item onto the next sentence. Files are read in order (shuffle_files=False),
    so the stream is the same on every run. The dataset is loaded (and, as tfds.load does, downloaded
    and prepared if it is not in `data_dir` yet) and its features checked now; examples are read
    lazily.
    """
    # Here, not at the top: only this source needs TensorFlow and TFDS (slow to load), and the backends'
    # table (data.backends) is imported by the synthetic data path, which must run without TensorFlow.
    tf = tf_cpu.import_tensorflow()
    tfds = tf_cpu.import_tensorflow_datasets()

    dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    spec = dataset.element_spec
    features = sorted(spec) if isinstance(spec, dict) else []
    if text_feature not in features:
        raise ValueError(
            f"TFDS dataset {name!r} has no feature {text_feature!r} (features:"
            f" {', '.join(features) or 'none'}): set data.tfds_text_feature"
        )
    if spec[text_feature].dtype != tf.string or spec[text_feature].shape.rank != 0:
        raise ValueError(
            f"TFDS dataset {name!r} feature {text_feature!r} is {spec[text_feature]}, not a"
            " single string: set data.tfds_text_feature to a text feature"
        )
    texts = dataset.map(lambda example: example[text_feature])  # skip decoding other features
    return _tfds_documents(texts.as_numpy_iterator(), f"TFDS {name} split {split!r}", split_text)


def _tfds_documents(texts: Iterable[bytes], where: str, split_text) -> Iterator[list[str]]:
    for index, raw in enumerate(texts):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{where} example {index}: invalid UTF-8 ({e.reason})") from None
        sentences = [s for line in text.split("\n") for s in split_text(line)]
        if sentences:
            yield sentences


def _name(settings) -> str:
    if not settings.tfds_name:
        raise ValueError("data.source='tfds' needs data.tfds_name, e.g. 'wikipedia/20230601.en'")
    return settings.tfds_name


def shard_documents(settings, split, shard: int, num_shards: int, bad_rows: BadRows) -> Iterator[list[str]]:
    """Output shard `shard` of `num_shards`: the shard-th of num_shards even splits of the split."""
    tfds = tf_cpu.import_tensorflow_datasets()  # here: only this source needs TFDS (see read_tfds_documents)

    name = _name(settings)
    part = tfds.even_splits(settings.tfds_split, n=num_shards)[shard]
    return read_tfds_documents(name, part, settings.tfds_text_feature, settings.tfds_data_dir, split_text=split)


def documents(settings, split, bad_rows: BadRows) -> Iterator[list[str]]:
    documents = read_tfds_documents(_name(settings), settings.tfds_split, settings.tfds_text_feature,
                                    settings.tfds_data_dir, split_text=split)
    return require_documents(documents, f"TFDS {settings.tfds_name!r} split {settings.tfds_split!r}",
                             check="data.tfds_split and data.tfds_text_feature")


BACKEND = Backend(
    name="tfds", reads="a TensorFlow Datasets dataset with a text feature, one document per example",
    keys=("tfds_name", "tfds_split", "tfds_text_feature", "tfds_data_dir", "sentence_splitter"),
    cache_keys=("tfds_data_dir",), documents=documents, shard=shard_documents,
)
