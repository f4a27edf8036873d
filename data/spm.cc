// spm.cc - the C functions of spm.h over SentencePiece's C++ SentencePieceProcessor.
// Built only where meson found libsentencepiece (data/spm_none.c stands in otherwise).
#include "data/spm.h"

extern "C" {
#include "common/error.h"
}

#include <sentencepiece_processor.h>

#include <cstring>
#include <new>
#include <string>
#include <vector>

struct spm_model {
    sentencepiece::SentencePieceProcessor sp;
};

extern "C" int spm_available(void) { return 1; }

extern "C" int spm_load(spm_model **out, const char *path) {
    *out = nullptr;
    spm_model *m = new (std::nothrow) spm_model;
    if (!m) return co_err_set(CO_ENOMEM, "%s: out of memory", path);
    try {
        auto st = m->sp.Load(path);
        if (!st.ok()) {
            int code = st.code() == sentencepiece::util::StatusCode::kNotFound ? CO_ENOENT : CO_EFORMAT;
            int rc = co_err_set(code, "--tokenizer-model %s: not a SentencePiece model: %s", path,
                                st.ToString().c_str());
            delete m;
            return rc;
        }
    } catch (const std::exception &e) {
        delete m;
        return co_err_set(CO_EFORMAT, "--tokenizer-model %s: %s", path, e.what());
    }
    *out = m;
    return 0;
}

extern "C" void spm_free(spm_model **m) {
    delete *m;
    *m = nullptr;
}

extern "C" int32_t spm_piece_count(const spm_model *m) { return m->sp.GetPieceSize(); }
extern "C" int32_t spm_bos_id(const spm_model *m) { return m->sp.bos_id(); }
extern "C" int32_t spm_eos_id(const spm_model *m) { return m->sp.eos_id(); }
extern "C" int32_t spm_pad_id(const spm_model *m) { return m->sp.pad_id(); }

extern "C" int32_t spm_piece_id(const spm_model *m, const char *piece, size_t n) {
    std::string p(piece, n);
    int id = m->sp.PieceToId(p);
    // PieceToId answers the unknown piece's id for any text not in the vocabulary
    return id >= 0 && id < m->sp.GetPieceSize() && m->sp.IdToPiece(id) == p ? id : -1;
}

extern "C" int64_t spm_id_to_piece(const spm_model *m, int32_t id, char *out, size_t cap) {
    if (id < 0 || id >= m->sp.GetPieceSize()) return -1;
    const std::string &p = m->sp.IdToPiece(id);
    if (cap > 0) {
        size_t k = p.size() < cap - 1 ? p.size() : cap - 1;
        memcpy(out, p.data(), k);
        out[k] = '\0';
    }
    return (int64_t)p.size();
}

extern "C" int64_t spm_encode(const spm_model *m, const char *text, size_t len, int32_t *out, size_t cap) {
    try {
        std::vector<int> ids;
        auto st = m->sp.Encode(std::string(text, len), &ids);
        if (!st.ok()) return co_err_set(CO_EINVAL, "SentencePiece encode: %s", st.ToString().c_str());
        for (size_t i = 0; i < ids.size() && i < cap; i++) out[i] = ids[i];
        return (int64_t)ids.size();
    } catch (const std::bad_alloc &) {
        return co_err_set(CO_ENOMEM, "SentencePiece encode: out of memory");
    }
}

extern "C" int64_t spm_decode(const spm_model *m, const int32_t *ids, size_t n, char *out, size_t cap) {
    int np = m->sp.GetPieceSize();
    try {
        std::vector<int> v(ids, ids + n);
        for (size_t i = 0; i < n; i++)
            if (v[i] < 0 || v[i] >= np)
                return co_err_set(CO_EINVAL, "decode: id %d out of range (SentencePiece model of %d pieces)", v[i], np);
        std::string s;
        auto st = m->sp.Decode(v, &s);
        if (!st.ok()) return co_err_set(CO_EINVAL, "SentencePiece decode: %s", st.ToString().c_str());
        if (cap > 0) {
            size_t k = s.size() < cap - 1 ? s.size() : cap - 1;
            memcpy(out, s.data(), k);
            out[k] = '\0';
        }
        return (int64_t)s.size();
    } catch (const std::bad_alloc &) {
        return co_err_set(CO_ENOMEM, "SentencePiece decode: out of memory");
    }
}
