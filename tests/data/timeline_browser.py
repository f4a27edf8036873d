#!/usr/bin/env python3
"""timeline_browser.py - a real browser draws `cohort timeline`'s SVG.

Writes a known 1F1B job's records (timeline_ref.write_job: p=4, m=8, dp=2), runs
`cohort timeline`, has headless Chromium render the SVG to a PNG, decodes the PNG here
(zlib and struct: no imaging library) and checks that
  - the PNG has the SVG's size;
  - it is not blank: between 5% and 90% of the pixels are not white, and many colours
    appear (at least 20 with 30 pixels or more);
  - every forward and backward colour of the SVG is on the page;
  - the boxes are where the SVG puts them: a pixel just inside each box's corner has the
    box's colour (at least 95% of the boxes 6 px wide or more).
Skips (exit 77) where Chromium is not installed (deploy/setup.sh installs Debian's
`chromium`); COHORT_CHROMIUM names another binary.

usage: timeline_browser.py COHORT [WORKDIR]   (default: a temporary directory, removed after a pass)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import timeline_ref  # noqa: E402

SVG_NS = "{http://www.w3.org/2000/svg}"


def find_chromium():
    env = os.environ.get("COHORT_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


def decode_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind = data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, ("unexpected PNG format", ihdr)
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(idat))
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        ft = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ft == 1:
                line[i] = (line[i] + a) & 255
            elif ft == 2:
                line[i] = (line[i] + b) & 255
            elif ft == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pr = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pr) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(w)])
        prev = line
    return w, h, rows


def hex_rgb(s):
    return tuple(int(s[i:i + 2], 16) for i in (1, 3, 5))


def close(a, b, tol=3):
    return all(abs(x - y) <= tol for x, y in zip(a, b))


def main():
    cohort = sys.argv[1]
    chromium = find_chromium()
    if not chromium:
        print("SKIP: no Chromium (/usr/bin/chromium; deploy/setup.sh installs Debian's chromium package)")
        sys.exit(77)
    work = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="cohort-timeline_browser-")
    os.makedirs(work, exist_ok=True)
    d = os.path.join(work, "job")
    timeline_ref.write_job(d, 4, 8, tp=1, dp=2, iterations=(2,))
    p = subprocess.run([cohort, "timeline", d, "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    svg = json.loads(p.stdout)["svg"]
    root = ET.parse(svg).getroot()
    W, H = int(root.get("width")), int(root.get("height"))
    png = os.path.join(work, "timeline.png")
    profile = tempfile.mkdtemp(prefix="chromium-", dir=work)
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           "--force-device-scale-factor=1", "--user-data-dir=" + profile, "--screenshot=" + png,
           "--window-size=%d,%d" % (W, H), "file://" + os.path.abspath(svg)]
    t = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=dict(os.environ, HOME=profile))
    took = time.time() - t
    assert r.returncode == 0 and os.path.exists(png), "chromium exit %d: %s" % (r.returncode, r.stderr[-2000:])
    print("chromium rendered %dx%d in %.1f s" % (W, H, took))
    w, h, px = decode_png(png)
    assert (w, h) == (W, H), ("PNG size", (w, h), "SVG size", (W, H))

    counts = {}
    for row in px:
        for c in row:
            counts[c] = counts.get(c, 0) + 1
    white = sum(n for c, n in counts.items() if min(c) >= 250)
    frac = 1 - white / (w * h)
    many = [c for c, n in counts.items() if n >= 30]
    print("%.1f%% of the pixels are not white; %d colours with 30 pixels or more" % (100 * frac, len(many)))
    assert 0.05 < frac < 0.9, "blank or solid page: %.3f not white" % frac
    assert len(many) >= 20, "too few colours: %d" % len(many)

    rects = [e for e in root.iter(SVG_NS + "rect") if e.get("class") == "ev"]
    fills = set()
    for e in rects:
        kind = e.find(SVG_NS + "title").text.split(": ")[1].split(" ")[0].rstrip(",")
        if kind in ("forward", "backward"):
            fills.add(e.get("fill"))
    assert len(fills) == 16, fills  # 8 micro batches x forward/backward
    missing = [f for f in fills if not any(close(hex_rgb(f), c) and n >= 30 for c, n in counts.items())]
    assert not missing, "colours not on the page: %s" % missing

    sampled = hits = 0
    for e in rects:
        x, y, rw, rh = (float(e.get(k)) for k in ("x", "y", "width", "height"))
        if rw < 6 or rh < 6:
            continue
        sampled += 1
        c = px[int(y + 2.5)][int(x + 2.5)]
        hits += close(c, hex_rgb(e.get("fill")))
    print("%d of %d boxes have their colour inside their corner" % (hits, sampled))
    assert sampled >= 100 and hits >= 0.95 * sampled, (hits, sampled)
    assert took < 30, "chromium took %.1f s" % took
    print("timeline_browser: ok")
    if len(sys.argv) <= 2:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
