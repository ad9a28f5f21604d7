"""Read the text in an image with the PP-OCR models shipped in rapidocr-onnxruntime, run by attograd's OnnxRunner.

python examples/ocr.py [IMAGE]        (pip install 'attograd[onnx]' rapidocr-onnxruntime pillow scipy)
With no IMAGE it renders a line of text with PIL and reads it back. The three models: detection (a DB text-probability
map: thresholded, split into connected regions, each region's box grown as DB's unclip does), direction (a crop read
upside down is turned over) and recognition (CTC over the character list stored in the model's metadata). Pre- and
post-processing are numpy/PIL; every model runs on attograd."""
from __future__ import annotations
import argparse, math, os, sys, time
import numpy as np
from PIL import Image, ImageDraw, ImageFont
# run as a script from examples/, keep the repository importable
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from attograd.nn.onnx import OnnxRunner

TEXT = "attograd reads ONNX 2026"
DET_THRESH, BOX_THRESH, UNCLIP, MIN_SIDE = 0.3, 0.5, 1.6, 3
REC_H, REC_MIN_W = 48, 320

def models_dir() -> str:
  try: import rapidocr_onnxruntime
  except ImportError: sys.exit("examples/ocr.py needs the models of rapidocr-onnxruntime: pip install rapidocr-onnxruntime")
  return os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models")

def render(text: str = TEXT) -> Image.Image:
  font = ImageFont.load_default(size=40)
  w = int(ImageDraw.Draw(Image.new("RGB", (1, 1))).textlength(text, font=font))
  img = Image.new("RGB", (w + 64, 104), "white")
  ImageDraw.Draw(img).text((32, 28), text, fill="black", font=font)
  return img

def normalize(img: Image.Image) -> np.ndarray:
  """HWC RGB uint8 -> 1CHW float32 in [-1, 1], channels in the BGR order PaddleOCR was trained on."""
  a = np.asarray(img.convert("RGB"), np.float32)[:, :, ::-1] / 255.0
  return ((a - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()

class Ocr:
  def __init__(self, mdir: str):
    self.det = OnnxRunner(os.path.join(mdir, "ch_PP-OCRv4_det_infer.onnx"))
    self.cls = OnnxRunner(os.path.join(mdir, "ch_ppocr_mobile_v2.0_cls_infer.onnx"))
    self.rec = OnnxRunner(os.path.join(mdir, "ch_PP-OCRv4_rec_infer.onnx"))
    meta = {p.key: p.value for p in self.rec.model.metadata_props}
    self.chars = [""] + meta["character"].splitlines() + [" "]  # CTC blank first; the model's last class is a space

  def boxes(self, img: Image.Image) -> list[tuple[int, int, int, int]]:
    """Text regions as (left, top, right, bottom) in the image, top to bottom then left to right."""
    w, h = img.size
    s = min(1.0, 960 / max(w, h))
    W, H = max(32, round(w * s / 32) * 32), max(32, round(h * s / 32) * 32)
    prob = next(iter(self.det({"x": normalize(img.resize((W, H), Image.BILINEAR))}).values())).numpy()[0, 0]
    mask = prob > DET_THRESH
    try:
      from scipy import ndimage
      mask = ndimage.binary_dilation(mask, np.ones((2, 2), bool))
      labels, n = ndimage.label(mask)
      regions = ndimage.find_objects(labels)
    except ImportError:  # without scipy: everything found is one region
      ys, xs = np.nonzero(mask)
      labels, n, regions = mask.astype(int), int(mask.any()), [(slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))] if mask.any() else []
    out = []
    for i, (sy, sx) in enumerate(regions[:n], 1):
      bh, bw = sy.stop - sy.start, sx.stop - sx.start
      if min(bh, bw) < MIN_SIDE or prob[sy, sx][labels[sy, sx] == i].mean() < BOX_THRESH: continue
      d = bh * bw * UNCLIP / (2 * (bh + bw))  # DB shrank each region by this much when it was trained: grow it back
      l, t, r, b = sx.start - d, sy.start - d, sx.stop + d, sy.stop + d
      out.append((max(0, int(l * w / W)), max(0, int(t * h / H)), min(w, math.ceil(r * w / W)), min(h, math.ceil(b * h / H))))
    return sorted(out, key=lambda b: (b[1] // 10, b[0]))

  def upright(self, crop: Image.Image) -> Image.Image:
    w = min(192, math.ceil(48 * crop.width / crop.height))
    x = np.zeros((1, 3, 48, 192), np.float32)
    x[..., :w] = normalize(crop.resize((w, 48), Image.BILINEAR))
    p = next(iter(self.cls({"x": x}).values())).numpy()[0]
    return crop.rotate(180) if p.argmax() == 1 and p[1] > 0.9 else crop

  def read_line(self, crop: Image.Image) -> tuple[str, float]:
    w = math.ceil(REC_H * crop.width / crop.height)
    W = max(REC_MIN_W, math.ceil(w / 32) * 32)  # few distinct widths: each one compiles its kernels once
    x = np.zeros((1, 3, REC_H, W), np.float32)
    x[..., :w] = normalize(crop.resize((w, REC_H), Image.BILINEAR))
    p = next(iter(self.rec({"x": x}).values())).numpy()[0]
    idx, conf = p.argmax(-1), p.max(-1)
    keep = (idx != 0) & np.concatenate([[True], idx[1:] != idx[:-1]])  # CTC: drop blanks and repeats
    return "".join(self.chars[i] for i in idx[keep]), float(conf[keep].mean()) if keep.any() else 0.0

  def __call__(self, img: Image.Image) -> list[tuple[tuple[int, int, int, int], str, float]]:
    return [(b, *self.read_line(self.upright(img.crop(b)))) for b in self.boxes(img)]

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("image", nargs="?", help="an image file (default: a rendered line of text)")
  args = ap.parse_args()
  img = Image.open(args.image) if args.image else render()
  ocr = Ocr(models_dir())
  t = time.perf_counter()
  lines = ocr(img)
  for box, text, conf in lines: print(f"{box}  {conf:.3f}  {text}")
  print(f"{len(lines)} line(s) in {time.perf_counter() - t:.1f} s (the first run compiles the kernels)")
  if not args.image:
    got = " ".join(t for _, t, _ in lines)
    print("rendered:", repr(TEXT), "read:", repr(got), "OK" if got == TEXT else "MISMATCH")
    if got != TEXT: sys.exit(1)

if __name__ == "__main__": main()
