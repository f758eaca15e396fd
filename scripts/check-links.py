#!/usr/bin/env python3
"""Check the links of the built book and of the README, offline.

Usage: scripts/check-links.py BOOK_DIR [MARKDOWN_FILE...]

Every relative link (href / src) of every HTML page under BOOK_DIR must name
a file of the book, and its #anchor an id in that page; every relative link of
the Markdown files (the README, read on GitHub) must name a file of the
repository. External links cannot be fetched (CI has no network), so only their
syntax is checked: a scheme and a host. Prints each broken link and exits 1.
"""
import html.parser
import os
import re
import sys
import urllib.parse


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            if name in ("href", "src") and value is not None:
                self.links.append(value)
            # Older pages name anchors this way.
            if tag == "a" and name == "name" and value:
                self.ids.add(value)


def external_ok(url):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "mailto":
        return "@" in parts.path
    return parts.scheme in ("http", "https") and bool(parts.netloc) and " " not in url


def check_book(book):
    book = os.path.normpath(book)
    pages, errors = {}, []
    for root, _, files in os.walk(book):
        for f in files:
            if f.endswith(".html"):
                path = os.path.join(root, f)
                p = Links()
                with open(path, encoding="utf-8") as fh:
                    p.feed(fh.read())
                pages[os.path.normpath(path)] = p
    for path, p in sorted(pages.items()):
        for link in p.links:
            if link.startswith("#"):
                target, frag = path, link[1:]
            elif re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", link):
                if link.startswith(("javascript:", "data:")):
                    continue
                if not external_ok(link):
                    errors.append(f"{path}: malformed external link {link}")
                continue
            else:
                parts = urllib.parse.urlsplit(link)
                # An absolute path is the book's root (mdbook's 404 page: site-url "/").
                base = book if parts.path.startswith("/") else os.path.dirname(path)
                target = os.path.normpath(os.path.join(base, urllib.parse.unquote(parts.path).lstrip("/")))
                frag = urllib.parse.unquote(parts.fragment)
                if os.path.isdir(target):
                    target = os.path.join(target, "index.html")
                if not os.path.exists(target):
                    errors.append(f"{path}: broken link {link} (no {target})")
                    continue
            if frag and target in pages and frag not in pages[target].ids:
                errors.append(f"{path}: broken anchor {link} (no id {frag!r} in {target})")
    return len(pages), errors


MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def check_markdown(path):
    errors = []
    with open(path, encoding="utf-8") as fh:
        # Code blocks and comments (SUMMARY.md's places for pages to come) are not links.
        text = re.sub(r"```.*?```|<!--.*?-->", "", fh.read(), flags=re.S)
    for link in MD_LINK.findall(text):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", link):
            if not external_ok(link):
                errors.append(f"{path}: malformed external link {link}")
            continue
        target = os.path.join(os.path.dirname(path), urllib.parse.unquote(link.split("#")[0]))
        if link.split("#")[0] and not os.path.exists(target):
            errors.append(f"{path}: broken link {link}")
    return errors


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    n, errors = check_book(sys.argv[1])
    if n == 0:
        errors.append(f"{sys.argv[1]}: no HTML pages (was the book built?)")
    for md in sys.argv[2:]:
        errors += check_markdown(md)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"check-links: {n} pages, {len(sys.argv) - 2} Markdown files, {len(errors)} broken links")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
