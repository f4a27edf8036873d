#!/usr/bin/env python3
"""gen_cu.py - translates a CUDA source (kernels/cuda/*.cu) into C++ for the CUDA stand-in
(tests/cudasim/, docs/testing.md), so the host compiler builds the real kernels.

    gen_cu.py INPUT.cu OUTPUT.cc [NAME]

  - k<...><<<grid, block[, smem[, stream]]>>>(args) becomes
    ::cudasim::launch("k<...>", __FILE__, __LINE__, grid, block, smem, stream, k<...>, args)
  - __shared__ T x;  T x[N];  T x[R][C];  extern __shared__ T x[];  become the checked
    handles of cudasim_device.h (svar, sptr, sarr2, sptr of the launch's dynamic buffer)
  - #pragma unroll lines are dropped (the host compiler does not know them)
Line numbers are kept (a #line directive names the original file, and every rewrite keeps
its newlines), so compiler messages and the stand-in's reports point into the .cu source.
"""
import re
import sys


def fail(msg):
    sys.stderr.write('gen_cu.py: %s\n' % msg)
    sys.exit(1)


def split_top(s, sep=','):
    """Splits s at sep outside (), [], {} and template angle brackets of kernel names."""
    out, depth, cur = [], 0, ''
    for ch in s:
        if ch in '([{':
            depth += 1
        elif ch in ')]}':
            depth -= 1
        if ch == sep and depth == 0:
            out.append(cur)
            cur = ''
        else:
            cur += ch
    out.append(cur)
    return [x.strip() for x in out]


def match_close(s, i, open_ch, close_ch):
    """Index of the bracket closing s[i] == open_ch."""
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_ch:
            depth += 1
        elif s[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    fail('unbalanced %s at offset %d' % (open_ch, i))


def rewrite_launches(src):
    out, pos = [], 0
    while True:
        i = src.find('<<<', pos)
        if i < 0:
            out.append(src[pos:])
            return ''.join(out)
        # the kernel name ends just before <<<: an identifier, maybe with template arguments
        j = i
        while j > 0 and src[j - 1].isspace():
            j -= 1
        end = j
        if src[j - 1] == '>':
            depth = 0
            while j > 0:
                j -= 1
                if src[j] == '>':
                    depth += 1
                elif src[j] == '<':
                    depth -= 1
                    if depth == 0:
                        break
        while j > 0 and (src[j - 1].isalnum() or src[j - 1] in '_:'):
            j -= 1
        name = src[j:end]
        k = src.find('>>>', i)
        if k < 0:
            fail('<<< without >>>')
        cfg = split_top(src[i + 3:k])
        if len(cfg) < 2 or len(cfg) > 4:
            fail('launch of %s: %d configuration values' % (name, len(cfg)))
        while len(cfg) < 4:
            cfg.append('0')
        p = k + 3
        while src[p].isspace():
            p += 1
        if src[p] != '(':
            fail('launch of %s: no argument list' % name)
        q = match_close(src, p, '(', ')')
        args = src[p + 1:q].strip()
        call = '::cudasim::launch("%s", __FILE__, __LINE__, %s, %s, %s, %s, %s%s)' % (
            name, cfg[0], cfg[1], cfg[2], cfg[3], name, ', ' + args if args else '')
        newlines = src[j:q + 1].count('\n')
        out.append(src[pos:j])
        out.append(call + '\n' * newlines)
        pos = q + 1


DECL = re.compile(r'(extern\s+)?__shared__\s+([^;]*);')
FIRST = re.compile(r'^([\w:<>\s]+?)\s+(\w+)\s*((?:\[[^\]]*\])*)\s*(?:,|$)')


def shared_decl(m):
    ext, body = m.group(1), re.sub(r'__align__\(\s*\d+\s*\)\s*', '', m.group(2))  # the stand-in aligns all
    f = FIRST.match(body)
    if not f:
        fail('cannot parse the __shared__ declaration "%s"' % m.group(0))
    typ = f.group(1).strip()
    decls = split_top(body[len(f.group(1)):], ',')
    out = []
    for d in decls:
        dm = re.match(r'^(\w+)\s*((?:\[[^\]]*\])*)$', d)
        if not dm:
            fail('cannot parse the __shared__ declarator "%s"' % d)
        name, dims = dm.group(1), re.findall(r'\[([^\]]*)\]', dm.group(2))
        if ext:
            if dims != ['']:
                fail('extern __shared__ %s must be an array of unknown size' % name)
            out.append('::cudasim::sptr<%s> %s = ::cudasim::sptr<%s>::make_dynamic("%s");' % (typ, name, typ, name))
        elif not dims:
            out.append('static ::cudasim::svar<%s> %s = ::cudasim::svar<%s>::make("%s");' % (typ, name, typ, name))
        elif len(dims) == 1:
            out.append('static ::cudasim::sptr<%s> %s = ::cudasim::sptr<%s>::make_static("%s", (%s));' % (
                typ, name, typ, name, dims[0]))
        elif len(dims) == 2:
            t2 = '::cudasim::sarr2<%s, (%s)>' % (typ, dims[1])
            out.append('static %s %s = %s::make("%s", (size_t)(%s) * (%s));' % (t2, name, t2, name, dims[0], dims[1]))
        else:
            fail('__shared__ %s: more than two dimensions' % name)
    return ' '.join(out) + '\n' * m.group(0).count('\n')


def main():
    if len(sys.argv) < 3:
        fail('usage: gen_cu.py INPUT.cu OUTPUT.cc [NAME]')
    src = open(sys.argv[1]).read()
    name = sys.argv[3] if len(sys.argv) > 3 else sys.argv[1]
    src = re.sub(r'^[ \t]*#pragma unroll.*$', '', src, flags=re.M)
    src = DECL.sub(shared_decl, src)
    src = rewrite_launches(src)
    with open(sys.argv[2], 'w') as f:
        f.write('// generated by tests/cudasim/gen_cu.py from %s: do not edit\n' % name)
        f.write('#line 1 "%s"\n' % name)
        f.write(src)


if __name__ == '__main__':
    main()
