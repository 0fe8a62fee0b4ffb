"""PDF metrics on small PDFs written by hand (one text line per page), read with pypdf."""

import json
import zipfile

import pytest

from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import general as G
from cua_jax.tasks.metrics import pdf as P


def make_pdf(path, pages):
    """A minimal PDF: each page shows one line of Helvetica text."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>", None, "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for text in pages:
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream.decode()}\nendstream")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {len(objects)} 0 R "
            "/Resources << /Font << /F1 3 0 R >> >> >>"
        )
        kids.append(f"{len(objects)} 0 R")
    objects[1] = f"<< /Type /Pages /Kids [{' '.join(kids)}] /Count {len(kids)} >>"
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    start = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{start}\n%%EOF\n".encode()
    path.write_bytes(bytes(out))
    return str(path)


def test_pdf_reader_sees_the_text(tmp_path):
    assert P.pdf_text(make_pdf(tmp_path / "a.pdf", ["Hello PDF"])).strip() == "Hello PDF"


def test_check_pdf_pages(tmp_path):
    path = make_pdf(tmp_path / "a.pdf", ["one", "two", "three"])
    assert P.check_pdf_pages(path, {"relation": "eq", "ref_value": 3}) == 1.0
    assert P.check_pdf_pages(path, {"relation": "lt", "ref_value": 3}) == 0.0
    assert P.check_pdf_pages(str(tmp_path / "absent.pdf"), {"relation": "eq", "ref_value": 0}) == 0.0
    with pytest.raises(JudgeError, match="relation 'about'"):
        P.check_pdf_pages(path, {"relation": "about", "ref_value": 3})


def test_compare_pdfs_single_and_lists(tmp_path):
    expected = make_pdf(tmp_path / "e.pdf", ["The quick brown fox"])
    assert P.compare_pdfs(make_pdf(tmp_path / "r.pdf", ["The quick brown fox"]), expected) == 1.0
    assert P.compare_pdfs(make_pdf(tmp_path / "w.pdf", ["zzzz"]), expected) == 0.0
    other = make_pdf(tmp_path / "o.pdf", ["jumps"])
    assert (
        P.compare_pdfs(
            [make_pdf(tmp_path / "r1.pdf", ["The quick brown fox"]), str(tmp_path / "absent.pdf")], [expected, other]
        )
        == 0.5
    )
    (tmp_path / "junk.pdf").write_text("not a pdf")
    assert P.compare_pdfs(str(tmp_path / "junk.pdf"), expected) == 0.0


def test_is_gold_text_included_in_pdf(tmp_path):
    pdf = make_pdf(tmp_path / "a.pdf", ["Name: Ann Lee", "Total 42"])
    gold = tmp_path / "gold.json"
    gold.write_text(json.dumps({"name": "Ann Lee", "total": "42"}))
    assert P.is_gold_text_included_in_pdf(pdf, str(gold)) == 1.0
    gold.write_text(json.dumps({"name": "Bob"}))
    assert P.is_gold_text_included_in_pdf(pdf, str(gold)) == 0.0


def zipped(path, members):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return str(path)


def test_compare_zip_files_with_pdf_members(tmp_path):
    pdf = open(make_pdf(tmp_path / "a.pdf", ["Report text"]), "rb").read()
    expected = zipped(tmp_path / "e.zip", {"notes.txt": "x", "report.pdf": pdf})
    assert G.compare_zip_files(zipped(tmp_path / "r.zip", {"notes.txt": "x", "report.pdf": pdf}), expected) == 1.0
    changed = open(make_pdf(tmp_path / "b.pdf", ["Another thing"]), "rb").read()
    assert G.compare_zip_files(zipped(tmp_path / "w.zip", {"notes.txt": "x", "report.pdf": changed}), expected) == 0.0
    assert G.compare_zip_files(zipped(tmp_path / "m.zip", {"notes.txt": "x"}), expected) == 0.0
