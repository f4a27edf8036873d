// bpe_ref.js - the reference side of the GPT-2 BPE test and benchmark: encodes every line
// of a JSONL corpus ({"text": ...}) with the npm package gpt-3-encoder and compares the ids
// with cohort's PREFIX.bin/.idx (written by `cohort data preprocess` without --append-eod).
//
//   node bpe_ref.js ENCODER_DIR CORPUS.jsonl PREFIX     exit 0 equal, 1 a difference
//   node bpe_ref.js ENCODER_DIR CORPUS.jsonl --time     only encodes; prints MB/s
'use strict';
const fs = require('fs');
const [dir, corpus, prefix] = process.argv.slice(2);
const enc = require(require('path').resolve(dir, 'Encoder.js'));
const lines = fs.readFileSync(corpus, 'utf-8').split('\n').filter((l) => l.length > 0);
const texts = lines.map((l) => JSON.parse(l).text);
let bytes = 0;
for (const t of texts) bytes += Buffer.byteLength(t, 'utf-8');

const t0 = process.hrtime.bigint();
const ids = texts.map((t) => enc.encode(t));
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
let ntok = 0;
for (const a of ids) ntok += a.length;
console.log(`gpt-3-encoder: ${texts.length} documents, ${(bytes / 1e6).toFixed(2)} MB, ${ntok} tokens in ` +
            `${secs.toFixed(2)} s: ${(bytes / 1e6 / secs).toFixed(2)} MB/s`);
if (prefix === '--time') process.exit(0);

const idx = fs.readFileSync(prefix + '.idx');
const bin = fs.readFileSync(prefix + '.bin');
const dtype = idx.readUInt8(17);
const nseq = Number(idx.readBigUInt64LE(18));
const ndoc = Number(idx.readBigUInt64LE(26));
const size = dtype === 8 ? 2 : 4;
const lens = [];
for (let i = 0; i < nseq; i++) lens.push(idx.readInt32LE(34 + 4 * i));
const docOff = 34 + 12 * nseq;
const docs = [];
for (let i = 0; i < ndoc; i++) docs.push(Number(idx.readBigInt64LE(docOff + 8 * i)));
if (ndoc - 1 !== texts.length) {
  console.log(`FAIL: ${ndoc - 1} documents in ${prefix}.idx, ${texts.length} lines in the corpus`);
  process.exit(1);
}
let pos = 0, seq = 0, bad = 0;
for (let d = 0; d < texts.length; d++) {
  const got = [];
  for (; seq < docs[d + 1]; seq++)
    for (let k = 0; k < lens[seq]; k++, pos += size) got.push(size === 2 ? bin.readUInt16LE(pos) : bin.readInt32LE(pos));
  const want = ids[d];
  let i = 0;
  while (i < got.length && i < want.length && got[i] === want[i]) i++;
  if (i < got.length || i < want.length) {
    if (bad++ < 5) {
      const ctx = JSON.stringify(enc.decode(want.slice(Math.max(0, i - 3), i + 3)));
      console.log(`FAIL: document ${d} (line ${d + 1}) differs at token ${i}: cohort ` +
                  `${JSON.stringify(got.slice(Math.max(0, i - 3), i + 3))} reference ` +
                  `${JSON.stringify(want.slice(Math.max(0, i - 3), i + 3))} around ${ctx}`);
    }
  }
}
if (bad) {
  console.log(`FAIL: ${bad} of ${texts.length} documents differ`);
  process.exit(1);
}
console.log(`ok: ${ntok} tokens of ${texts.length} documents identical`);
