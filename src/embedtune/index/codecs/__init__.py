"""Codecs: how each stored (compressed) vector is encoded, what it costs in bytes, and how it is searched.

One implementation of every quantiser, used both by ``compress plan`` to score candidates
(:class:`QuantizedIndex`) and by the deployed index (``index build``, :mod:`embedtune.index.store`),
so the plan scores the codes that are served.

A compressor decides the dimension ``k``; a precision decides the bytes per dimension. Users pay
for bytes of RAM per vector, so every quality figure of a deployed setting is a pair
(compressor, precision). The precisions:

================  ======================  ==================  ===============================================
name              bytes in RAM / vector   bytes on disk       search
================  ======================  ==================  ===============================================
float32           ``4k``                  ``4k``              exact inner product
float16           ``2k``                  ``2k``              FAISS ``SQfp16`` (query float32, docs fp16)
int8              ``k``                   ``k``               FAISS ``SQ8`` with per-dimension ranges
                                                              calibrated on the corpus (:class:`Calibration`,
                                                              saved as safetensors), float query (asymmetric)
binary            ``ceil(k / 8)``         ``ceil(k / 8)``     sign bits, Hamming distance
binary-asym       ``ceil(k / 8)``         ``ceil(k / 8)``     Hamming top ``candidates``, rescored as float
                                                              query · ±1 sign vector
binary-rescore    ``ceil(k / 8)``         ``ceil(k/8) + 4k``  Hamming top ``candidates``, rescored against the
                                                              float32 vectors memory-mapped from disk
int4              ``ceil(k / 2)``         ``ceil(k / 2)``     FAISS ``SQ4``: 4 bits per dimension, per-dimension
                                                              ranges trained on the corpus, float query
rabitq1           ``ceil(k/8) + 8``       same                FAISS ``RaBitQ`` (Gao & Long 2024): sign bits of
                                                              the vector minus the corpus centroid, plus two
                                                              float32 factors per vector; 4-bit query
rabitq1-rescore   ``ceil(k/8) + 8``       ``+ 4k``            RaBitQ top ``candidates``, rescored against the
                                                              float32 vectors memory-mapped from disk
rabitq4           ``ceil(k/8) + 8 +``     same                FAISS ``RaBitQ4`` (extended RaBitQ): the sign bit
                  ``ceil(3k/8) + 12``                         plus 3 more bits per dimension, and three more
                                                              float32 factors per vector
turboquant1       ``ceil(k / 8)``         same                FAISS ``SQtqmse1`` (TurboQuant, Zandieh et al.
                                                              2025): Lloyd-Max codes for unit vectors, 1 bit
                                                              per dimension, no training, float query
turboquant4       ``ceil(k / 2)``         same                FAISS ``SQtqmse4``: the same at 4 bits
faiss:FACTORY     the code size (+ 8 for  same                any FAISS ``index_factory`` string, e.g.
                  IVF list ids)                               ``faiss:OPQ16,PQ16``, ``faiss:PQ32x4fs`` or
                                                              ``faiss:RR,SQtqmse4`` (randomly rotated first)
================  ======================  ==================  ===============================================

The RaBitQ and TurboQuant precisions are FAISS's own index types (``RaBitQ``, ``RaBitQ4``,
``SQtqmse1``, ``SQtqmse4``), with their defaults: FAISS applies no random rotation before either
(prefix ``RR,`` through ``faiss:`` for one). Their bytes are the code FAISS stores per vector,
factors included (:func:`factory_code_bytes`, checked against ``sa_code_size`` and the serialized
index in the tests). They need faiss-cpu >= 1.11.0 (RaBitQ), 1.13.1 (multi-bit RaBitQ) and 1.14.2
(TurboQuant); an older FAISS is an error naming the release (:func:`check_faiss_supports`).

Fixed costs that do not grow with the corpus (int8 ranges: ``8k`` bytes; PQ codebooks; the
compressor's weights) are reported separately by :meth:`QuantizedIndex.fixed_bytes`.

Every search returns ``(D, I)`` with ``D`` higher-is-better and ties broken by ascending row, so
results are deterministic whatever the backend.

Every row of the table is a registered codec object (:class:`PrecisionCodec`,
:mod:`~embedtune.index.codecs.precision_registry`): its bytes in RAM and read per query, its tier,
whether FAISS serves it, how it is built on the corpus, searched, encoded and saved (each saved
file recorded by its sha256), and its row of the store settings. :class:`Precision` looks a name up
there, and nothing else dispatches on names: a new precision is one module (a :class:`PrecisionCodec`
subclass decorated with :func:`register_precision`) plus one line (its import in
:mod:`~embedtune.index.codecs.precision`), and ``tests/test_codec_registry.py`` checks it with the others.

The modules, one codec idea each: :mod:`~embedtune.index.codecs.precision_registry` (the codec
interface and the registry), :mod:`~embedtune.index.codecs.precision` (a name and its search settings),
:mod:`~embedtune.index.codecs.float_codecs` (float32, float16),
:mod:`~embedtune.index.codecs.int8` (SQ8 ranges, s-t int8), :mod:`~embedtune.index.codecs.binary`
(sign bits, Hamming, rescoring), :mod:`~embedtune.index.codecs.faiss_codes` (FAISS factory strings, and the
built-in FAISS precisions),
:mod:`~embedtune.index.codecs.quantized_index` (a corpus at one precision, searched as deployed),
:mod:`~embedtune.index.codecs.deployed` (the codes of new vectors, with the parameters fitted once),
:mod:`~embedtune.index.codecs.transform` (the KLT codecs), :mod:`~embedtune.index.codecs.weighted` (``klt-wpq``:
the KLT codec weighted for the score's error, served as a FAISS additive quantiser), :mod:`~embedtune.index.codecs.anisotropic`
(``klt-apq``: its codes chosen for the score error of the queries that rank a document high),
:mod:`~embedtune.index.codecs.textbook` (``klt-sq``: the textbook transform coder),
:mod:`~embedtune.index.codecs.trellis` (``klt-tcq``: a trellis code over the principal axes, nearest the bound) and
:mod:`~embedtune.index.codecs.sphere` (the ``-sphere`` families: a cosine model's documents ranked by the direction
of their decoded vectors, no extra byte).

>>> from embedtune.index.codecs import Precision, QuantizedIndex
>>> index = QuantizedIndex.build(doc_vectors, Precision("int8"))          # doctest: +SKIP
>>> D, I = index.search(query_vectors, k=10)                              # doctest: +SKIP
>>> Precision("binary-asym").ram_bytes(128), Precision("binary-rescore").disk_bytes(128)
(16, 528)
"""

# precision first: it imports the built-in codecs in the order they are registered and listed (PRECISIONS).
from embedtune.index.codecs.precision import FAISS_PRECISIONS, FLOAT_RESCORED, PRECISIONS, Precision, bytes_per_vector
from embedtune.index.codecs.precision_registry import (
    PrecisionCodec,
    faiss_index_of,
    precision_codec,
    precision_examples,
    register_precision,
    registered_precisions,
)
from embedtune.index.codecs.binary import Rescore, binary_codes, binary_index, binary_search, hamming_search, sign_vectors
from embedtune.index.codecs.faiss_codes import (
    check_faiss_supports,
    factory_code_bytes,
    faiss_release_needed,
    faiss_version_error,
    new_factory_index,
    without_polysemous_training,
)
from embedtune.index.codecs.int8 import Calibration, int8_quantize, int8_ranges, int8_search, sq8_index, sq8_search
from embedtune.index.codecs.quantized_index import (
    CALIBRATION_FILE,
    CALIBRATION_JSON,
    CODEC_FILE,
    PRECISION_FILE,
    QuantizedIndex,
    load_precision,
    read_codec_index,
)
from embedtune.index.codecs.deployed import PRECISION_SUBFOLDER, DeployedCodec
from embedtune.index.codecs.rate_distortion import corpus_spectrum, distortion_report, gap_db, gaussian_bound, water_level
from embedtune.index.codecs.registry import CodecFamily, codec_family, is_registered_codec, register_codec, registered_codecs
from embedtune.index.codecs.transform import KltPQ, KltPQ4, KltPQ4Sphere, KltRQ
from embedtune.index.codecs.textbook import TABLES_FILE, KltSQ, KltSQSphere, is_rotated_index, read_rotated_index
from embedtune.index.codecs.trellis import KltTCQ, KltTCQ12, KltTCQ12Sphere, KltTCQSphere
from embedtune.index.codecs.weighted import KltWeightedPQ
from embedtune.index.codecs.anisotropic import KltAnisotropicPQ, KltAnisotropicPQSphere

__all__ = [
    "faiss_index_of",
    "without_polysemous_training",
    "PRECISIONS",
    "FAISS_PRECISIONS",
    "FLOAT_RESCORED",
    "Precision",
    "bytes_per_vector",
    "PrecisionCodec",
    "register_precision",
    "registered_precisions",
    "precision_codec",
    "precision_examples",
    "Calibration",
    "sq8_index",
    "sq8_search",
    "int8_ranges",
    "int8_quantize",
    "int8_search",
    "Rescore",
    "binary_codes",
    "sign_vectors",
    "binary_index",
    "hamming_search",
    "binary_search",
    "factory_code_bytes",
    "faiss_release_needed",
    "check_faiss_supports",
    "faiss_version_error",
    "new_factory_index",
    "QuantizedIndex",
    "load_precision",
    "PRECISION_FILE",
    "CALIBRATION_FILE",
    "CALIBRATION_JSON",
    "CODEC_FILE",
    "read_codec_index",
    "DeployedCodec",
    "PRECISION_SUBFOLDER",
    "CodecFamily",
    "register_codec",
    "registered_codecs",
    "codec_family",
    "is_registered_codec",
    "KltPQ",
    "KltPQ4",
    "KltPQ4Sphere",
    "KltRQ",
    "KltSQ",
    "KltSQSphere",
    "TABLES_FILE",
    "is_rotated_index",
    "read_rotated_index",
    "KltTCQ",
    "KltTCQSphere",
    "KltTCQ12",
    "KltTCQ12Sphere",
    "KltWeightedPQ",
    "KltAnisotropicPQ",
    "KltAnisotropicPQSphere",
    "corpus_spectrum",
    "water_level",
    "gaussian_bound",
    "gap_db",
    "distortion_report",
]
