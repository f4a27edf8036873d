/* npy.h - minimal .npy (numpy format version 1.0) writer and reader for 1-D and 2-D
 * little-endian integer arrays, C order. Files written here load with numpy.load. */
#ifndef COHORT_DATA_NPY_H
#define COHORT_DATA_NPY_H

#include <stddef.h>
#include <stdint.h>

/* descr is a numpy type string: "<i2", "<u2", "<i4", "<u4", "<i8", "<u8". ndim is 1 or 2. Crash-safe write. */
/* (The temporary file name is unique per process, so concurrent writers are safe.) */
int npy_write(const char *path, const char *descr, int ndim, const int64_t shape[2], const void *data);

/* Reads path; checks descr equals want_descr, C order, ndim == want_ndim and the data size.
 * On success *data is malloc'ed (caller frees) and shape[] is filled. CO_EFORMAT (with
 * detail) on any mismatch, CO_ENOENT when missing. */
int npy_read(const char *path, const char *want_descr, int want_ndim, int64_t shape[2], void **data);

#endif
