"""Reference writer of Megatron's indexed dataset (.bin/.idx), restated with numpy from
megatron/core/datasets/indexed_dataset.py (IndexedDatasetBuilder + _IndexWriter)."""
import struct

import numpy

DTYPES = {1: numpy.uint8, 2: numpy.int8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64,
          6: numpy.float64, 7: numpy.float32, 8: numpy.uint16}
CODES = {v: k for k, v in DTYPES.items()}


def write(prefix, documents, dtype):
    """documents: list of documents, each a list of sequences (lists of ints)."""
    sequence_lengths = []
    document_indices = [0]
    with open(prefix + ".bin", "wb") as data:
        for doc in documents:
            for seq in doc:  # add_item
                arr = numpy.array(seq, dtype=dtype)
                data.write(arr.tobytes(order="C"))
                sequence_lengths.append(arr.size)
            document_indices.append(len(sequence_lengths))  # end_document
    itemsize = numpy.dtype(dtype).itemsize
    pointers = []
    cur = 0
    for length in sequence_lengths:
        pointers.append(cur)
        cur += length * itemsize
    with open(prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00")
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", CODES[dtype]))
        idx.write(struct.pack("<Q", len(sequence_lengths)))
        idx.write(struct.pack("<Q", len(document_indices)))
        idx.write(numpy.array(sequence_lengths, dtype=numpy.int32).tobytes(order="C"))
        idx.write(numpy.array(pointers, dtype=numpy.int64).tobytes(order="C"))
        idx.write(numpy.array(document_indices, dtype=numpy.int64).tobytes(order="C"))


def read_lengths(prefix):
    with open(prefix + ".idx", "rb") as f:
        head = f.read(34)
        n = struct.unpack("<Q", head[18:26])[0]
        return numpy.frombuffer(f.read(4 * n), dtype=numpy.int32).copy(), DTYPES[head[17]]
