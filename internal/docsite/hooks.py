"""MkDocs hooks of the documentation site (mkdocs.yml).

- A nav entry ending in *.md lists the matching pages, sorted by path.
- Every page under docs/ must be in the nav, or the build fails.
- A link to a file of the repository that is not a page or asset of the
  site (source code, a folder) points to that file on the repository.
- Inline code that names a tracked path (`lockserver/api/api.go`,
  `harness/...`, `functions/payoutbus.PushBridge`) becomes a link: to the
  page when it is one, else to the repository.
- After the build, every link and image of every built page must reach a
  file of the site and, with a #fragment, an element with that id: a
  broken link or anchor fails the build (mkdocs --strict checks files,
  not anchors).
"""

import glob
import os
import posixpath
import re
import subprocess
import urllib.parse

from mkdocs.exceptions import PluginError

_root = ""
_files = set()  # tracked files, repo-relative
_tracked = set()  # and every folder above them
_blob = ""  # repo_url + edit_uri


def on_config(config):
    global _root, _blob
    _root = os.path.normpath(os.path.join(os.path.dirname(config["config_file_path"]), "..", ".."))
    out = subprocess.run(["git", "-C", _root, "ls-files"], check=True, capture_output=True, text=True).stdout
    _files.update(out.splitlines())
    for path in _files:
        while path and path not in _tracked:
            _tracked.add(path)
            path = posixpath.dirname(path)
    _blob = config["repo_url"].rstrip("/") + "/" + config["edit_uri"].strip("/") + "/"
    config["nav"] = _expand(config["nav"], config["docs_dir"])
    return config


def _expand(entry, docs_dir):
    if isinstance(entry, list):
        return [_expand(e, docs_dir) for e in entry]
    if isinstance(entry, dict):
        return {k: _expand(v, docs_dir) for k, v in entry.items()}
    if isinstance(entry, str) and entry.endswith("*.md"):
        found = sorted(os.path.relpath(p, docs_dir) for p in glob.glob(os.path.join(docs_dir, entry)))
        if not found:
            raise PluginError(f"docsite: nav entry {entry} matches no page")
        return found
    return entry


def on_nav(nav, config, files):
    listed = {p.file.src_uri for p in nav.pages}
    missing = sorted(f.src_uri for f in files.documentation_pages() if f.src_uri.startswith("docs/") and f.src_uri not in listed)
    if missing:
        raise PluginError("docsite: pages missing from the nav of internal/docsite/mkdocs.yml: " + ", ".join(missing))
    return nav


def _repo_url(path):
    return _blob + path if path in _files else _blob.replace("/blob/", "/tree/") + path


_MD_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def on_page_markdown(markdown, page, config, files):
    base = posixpath.dirname(page.file.src_uri)

    def rewrite(m):
        target = m.group(2)
        if re.match(r"^[a-z]+:", target):
            return m.group(0)
        path = posixpath.normpath(posixpath.join(base, target))
        if files.get_file_from_path(path) is not None or path not in _tracked:
            return m.group(0)  # a page or asset, or broken: mkdocs --strict says so
        return m.group(1) + _repo_url(path) + (m.group(3) or "") + m.group(4)

    return _MD_LINK.sub(rewrite, markdown)


# An anchor or a preformatted block is kept as it is; a lone inline code
# element may be a path.
_CODE = re.compile(r"<a\b.*?</a>|<pre\b.*?</pre>|<code>([^<]+)</code>", re.S)


def on_page_content(html, page, config, files):
    def link(m):
        text = m.group(1)
        if text is None:
            return m.group(0)
        path = text.strip()
        path = path[2:] if path.startswith("./") else path
        path = re.sub(r"/(\.\.\.)?$", "", path)
        if path not in _tracked and "." in posixpath.basename(path):
            path = path.rsplit(".", 1)[0]  # a package's identifier: pkg/path.Name
        if "/" not in path or path not in _tracked:
            return m.group(0)
        f = files.get_file_from_path(path)
        href = f.url_relative_to(page.file) if f is not None else _repo_url(path)
        return f'<a href="{href}">{m.group(0)}</a>'

    return _CODE.sub(link, html)


_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'\b(?:href|src)="([^"]*)"')


def on_post_build(config):
    site = config["site_dir"]
    pages = [
        os.path.join(d, f)
        for d, _, names in os.walk(site)
        for f in names
        if f.endswith(".html") and f != "404.html"  # 404.html links from the site's root
    ]
    html = {p: open(p, encoding="utf-8").read() for p in pages}
    ids = {p: set(_ID.findall(text)) for p, text in html.items()}
    broken = []
    for page, text in html.items():
        for ref in _REF.findall(text):
            if re.match(r"^[a-z]+:", ref):
                continue
            path, _, frag = urllib.parse.unquote(ref).partition("#")
            target = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(target):
                broken.append(f"{os.path.relpath(page, site)}: {ref}: no such file")
            elif frag and target in ids and frag not in ids[target]:
                broken.append(f"{os.path.relpath(page, site)}: {ref}: no element with id {frag}")
    if broken:
        raise PluginError("docsite: broken links in the built site:\n  " + "\n  ".join(sorted(set(broken))))
