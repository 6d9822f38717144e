"""tools/check_site.py: headless Chromium finds a broken link, a missing anchor and a missing image."""

from __future__ import annotations

import base64

PNG = base64.b64decode(  # a 1 x 1 PNG
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def page(body: str) -> str:
    # an icon of its own: without one the browser asks for /favicon.ico, a failed request the checker reports
    return f'<!doctype html><html><head><title>t</title><link rel="icon" href="data:,"></head><body>{body}</body></html>'


def test_a_sound_site_passes_and_each_kind_of_fault_is_reported(check_site, tmp_path, capsys):
    site = tmp_path / "site"
    (site / "figures").mkdir(parents=True)
    (site / "figures" / "dot.png").write_bytes(PNG)
    (site / "index.html").write_text(page('<a href="other.html#part">other</a><img src="figures/dot.png">'))
    (site / "other.html").write_text(page('<h2 id="part">part</h2><a href="index.html">home</a>'
                                          '<a href="https://example.org/">elsewhere</a>'))
    assert check_site.main([str(site)]) == 0
    assert "2 pages loaded in Chromium" in capsys.readouterr().out

    (site / "index.html").write_text(page('<a href="other.html#nowhere">a</a><a href="gone.html">b</a>'
                                          '<img src="figures/missing.png"><img src="figures/fake.png">'))
    (site / "figures" / "fake.png").write_text("not an image")
    assert check_site.main([str(site)]) == 1
    out = capsys.readouterr().out
    assert "no element with id 'nowhere'" in out
    assert "gone.html, which does not exist" in out
    assert "image figures/missing.png does not exist" in out
    assert "image figures/fake.png is not an image" in out
    assert "the browser's request failed: 404 /figures/missing.png" in out
