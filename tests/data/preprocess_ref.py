"""Reference of Megatron's tools/preprocess_data.py output for a JSONL file, given the
tokenizer as a Python function: the Encoder's rules (a string or a list of strings per key,
empty sentences dropped, EOD appended to the last sequence of a non-empty document) and the
IndexedDatasetBuilder writer of indexed_ref.py with Megatron's dtype rule."""
import json

import numpy

import indexed_ref


def optimal_dtype(vocab_size):
    return numpy.uint16 if vocab_size is not None and vocab_size < 65500 else numpy.int32


def preprocess(jsonl_path, out_prefix, keys, tokenize, eod, vocab_size, append_eod, skip_bad=False):
    docs = {k: [] for k in keys}
    with open(jsonl_path, encoding="utf-8") as f:
        for line in f:
            try:
                data = json.loads(line)
                values = [data[k] for k in keys]
                if not isinstance(data, dict) or not all(
                        isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))
                        for v in values):
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                if skip_bad:
                    continue
                raise
            for k, text in zip(keys, values):
                sentences = text if isinstance(text, list) else [text]
                seqs = [tokenize(s) for s in sentences]
                seqs = [s for s in seqs if len(s) > 0]
                if seqs and append_eod:
                    seqs[-1] = seqs[-1] + [eod]
                docs[k].append(seqs)
    for k in keys:
        indexed_ref.write("%s_%s_document" % (out_prefix, k), docs[k], optimal_dtype(vocab_size))
