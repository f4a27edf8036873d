"""Reference (numpy) implementation of Megatron-LM GPTDataset's sample order.

Restates megatron/core/datasets/gpt_dataset.py, helpers.cpp (build_sample_idx),
blended_megatron_dataset_builder/utils (split parsing) and MockGPTLowLevelDataset, as described in
shared/reference/megatron-facts.md section 2, with add_extra_token_to_sequence = True and
drop_last_partial_sequence = True. Used by check_data.py to test cohort's C implementation."""
import re

import numpy


def parse_split(split):
    vec = list(map(float, re.findall(r"[.0-9]+", split)))
    vec = vec + [0.0 for _ in range(3 - len(vec))]
    assert len(vec) == 3 and all(x >= 0 for x in vec) and sum(vec) > 0
    vec = [x / sum(vec) for x in vec]
    bookends = [0]
    for s in vec:
        bookends.append(bookends[-1] + s)
    return [None if b == e else (b, e) for b, e in zip(bookends[:-1], bookends[1:])]


def split_range(split, index, num_elements):
    m = parse_split(split)[index]
    if m is None:
        return None
    return int(round(m[0] * float(num_elements))), int(round(m[1] * float(num_elements)))


def mock_lengths():
    rng = numpy.random.default_rng(seed=0)
    return rng.integers(low=1, high=4096, size=100000, dtype=numpy.int32)


def mock_get(lengths, vocab, eod, idx, offset=0, length=None):
    n = int(lengths[idx])
    doc = numpy.concatenate([(numpy.arange(n - 1) + 1) % vocab, [eod]]).astype(numpy.int64)
    if length is None:
        length = n - offset
    return doc[offset:offset + length]


def _document_index(documents, num_epochs, rs, separate):
    if not separate or num_epochs == 1:
        di = numpy.mgrid[0:num_epochs, 0:len(documents)][1]
        di[:] = documents
        di = di.reshape(-1).astype(numpy.int32)
        rs.shuffle(di)
        return di
    first = _document_index(documents, num_epochs - 1, rs, False)
    last = _document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def _sample_index(sizes, doc_idx, seq_length, num_samples):
    out = numpy.zeros((num_samples + 1, 2), dtype=numpy.int64)
    di = 0
    off = 0
    sizes = sizes.tolist()
    doc_idx = doc_idx.tolist()
    for s in range(1, num_samples + 1):
        remaining = seq_length + 1
        while remaining != 0:
            doc_len = sizes[doc_idx[di]] - off
            remaining -= doc_len
            if remaining <= 0:
                off += remaining + doc_len - 1
                remaining = 0
            else:
                di += 1
                off = 0
        out[s, 0] = di
        out[s, 1] = off
    dtype = numpy.int32 if max(len(doc_idx), max(sizes)) <= numpy.iinfo(numpy.int32).max else numpy.int64
    return out.astype(dtype)


def _shuffle_index(num_samples, total_size, rs):
    dtype_ = numpy.uint32
    if total_size >= (numpy.iinfo(numpy.uint32).max - 1):
        dtype_ = numpy.int64
    first = numpy.arange(start=0, stop=num_samples, step=1, dtype=dtype_)
    rs.shuffle(first)
    if num_samples == total_size:
        return first
    last = numpy.arange(start=num_samples, stop=total_size, step=1, dtype=dtype_)
    rs.shuffle(last)
    return numpy.concatenate((first, last))


def build(sizes, split, index, seq_length, seed, num_samples):
    """Returns None for a zero-width split, else a dict with document_index, sample_index,
    shuffle_index, num_epochs, separate_final_epoch."""
    rng = split_range(split, index, len(sizes))
    if rng is None:
        return None
    documents = numpy.arange(rng[0], rng[1], dtype=numpy.int32)
    tokens_per_epoch = int(numpy.sum(sizes[documents]))
    num_epochs = 1
    num_tokens = tokens_per_epoch
    while num_tokens < num_samples * seq_length + 1:
        num_epochs += 1
        num_tokens += tokens_per_epoch
    if num_epochs == 1:
        separate = False
    else:
        sans = ((num_epochs - 1) * tokens_per_epoch - 1) // seq_length
        from_final = num_samples - sans
        per_epoch = (tokens_per_epoch - 1) // seq_length
        assert 0 <= from_final <= per_epoch + 1
        separate = from_final < int(0.80 * per_epoch)
    rs = numpy.random.RandomState(seed)
    doc_idx = _document_index(documents, num_epochs, rs, separate)
    total = (num_epochs * tokens_per_epoch - 1) // seq_length
    sample_idx = _sample_index(sizes, doc_idx, seq_length, total)
    if separate:
        shuffle = _shuffle_index(sans, sample_idx.shape[0] - 1, rs)
    else:
        shuffle = _shuffle_index(sample_idx.shape[0] - 1, sample_idx.shape[0] - 1, rs)
    return dict(document_index=doc_idx, sample_index=sample_idx, shuffle_index=shuffle,
                num_epochs=num_epochs, separate_final_epoch=separate)


def get_text(r, get, i, seq_length):
    """Megatron's _query_document_sample_shuffle_indices: L+1 tokens of item i, -1 padded.
    get(doc_id, offset, length) returns a sequence's tokens."""
    j = r["shuffle_index"][i]
    b, bo = (int(x) for x in r["sample_index"][j])
    e, eo = (int(x) for x in r["sample_index"][j + 1])
    di = r["document_index"]
    parts = []
    if b == e:
        parts.append(get(di[b], bo, eo - bo + 1))
    else:
        for p in range(b, e + 1):
            off = 0 if p > b else bo
            length = None if p < e else eo + 1
            parts.append(get(di[p], off, length))
    text = numpy.concatenate(parts).astype(numpy.int64)
    if len(text) < seq_length + 1:
        text = numpy.concatenate([text, numpy.full(seq_length + 1 - len(text), -1)])
    return text
