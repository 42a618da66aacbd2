#!/usr/bin/env python3
"""Fails when the library's modules import each other in a cycle (issue 28: every arrow points
down: modes → runtime → prepare/session → sys; nothing below imports above).

The graph. A node is a module of the library crate, one per file: src/a.rs and src/a/mod.rs are
`a`, src/a/b.rs is `a::b` (a `mod x { … }` written inside a file belongs to that file's node).
An edge A → B exists when A's file names a path that resolves to B:
  * `use` trees, `pub use` included (`use crate::a::{b::C, d}`, `use super::x`, `use self::y`);
  * paths written inline in code (`crate::a::f()`, `super::b::C`, `$crate::…` in macros), and
    paths that start at a child module of A or at a name A imported (`use crate::shell;` then
    `shell::procs::kill(…)` is an edge to `shell::procs`).
A path resolves to the deepest module it names: `crate::shell::procs::kill` → `shell::procs`;
a name a module re-exports (`pub use local::Shell;` in shell/mod.rs, `pub use error::Error;` in
lib.rs) is followed to where it is defined. An edge from a module to one of its ancestors
(`super::…` from a child, `crate::Error` seen as the root) is not counted: the parent declares
the child and is its namespace, so that arrow is the nesting itself. Everything else counts,
parent → child included. Test code counts too (`#[cfg(test)] mod tests` is part of its file):
a test of a low module that reaches up is an arrow up like any other.

Comments, strings and character literals are skipped; the binary (src/main.rs, `agent_bash::…`)
is a crate of its own and only ever points down into the library.

Why a script and not a Rust test over the sources: it needs no build, so `make check` (fmt and
clippy, no test build) can run it in a tenth of a second, and `make test` / `make test-fast`
before they compile anything. python3 is already needed by the test run (the MCP client).

Usage: scripts/check-cycles.py [--graph] [SRC_DIR]   (default: the src/ beside this script).
Exits 1 and prints each cycle, with the file and line of every edge in it, when there is one;
`--graph` also prints every edge.
"""

import os
import re
import sys

KEYWORDS_BEFORE_USE = {";", "{", "}", "]", "pub", ")", None}


def strip(text):
    """The text with comments, strings and char literals blanked (newlines kept for lines)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and not _ident_char(text, i - 1):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('a', '\n', '\u{1F600}', '"') or a lifetime ('a, 'static).
            m = re.match(r"'(\\[^']*|[^\\'\n])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _ident_char(text, i):
    return i >= 0 and (text[i].isalnum() or text[i] == "_")


TOKEN = re.compile(r"\$?[A-Za-z_][A-Za-z0-9_]*|::|[{}();,*\[\]#!]|\S")


def tokens(text):
    """(token, line) pairs of the stripped text."""
    line = 1
    pos = 0
    for m in TOKEN.finditer(text):
        line += text.count("\n", pos, m.start())
        pos = m.start()
        yield m.group(0), line


def module_of(src, path):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    if rel == ["lib"]:
        return ()
    return tuple(rel)


class File:
    def __init__(self, module, path, toks):
        self.module = module
        self.path = path
        self.toks = toks
        self.reexports = {}  # name → absolute path (tuple), from `pub use`
        self.imports = {}  # name → absolute path, from every `use`
        self.refs = []  # (absolute path, line)


def parse_use_tree(toks, i, prefix, out):
    """Parses one use tree at toks[i]; appends (path, alias or None, line) to out; returns the
    index after the tree."""
    path = list(prefix)
    line = toks[i][1] if i < len(toks) else 0
    if i < len(toks) and toks[i][0] == "::":
        i += 1
    while i < len(toks):
        t, line = toks[i]
        if t == "{":
            i += 1
            while i < len(toks) and toks[i][0] != "}":
                i = parse_use_tree(toks, i, path, out)
                if i < len(toks) and toks[i][0] == ",":
                    i += 1
            return i + 1
        if t == "*":
            out.append((tuple(path), "*", line))
            return i + 1
        i += 1
        if i < len(toks) and toks[i][0] == "::":
            path.append(t)
            i += 1
            continue
        if t != "self" or not path:
            path.append(t)  # `a::{self, b}`: `self` is `a` itself
        alias = None
        if i + 1 < len(toks) and toks[i][0] == "as":
            alias = toks[i + 1][0]
            i += 2
        out.append((tuple(path), alias, line))
        return i
    return i


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}
        for root, _, names in os.walk(src):
            for name in sorted(names):
                path = os.path.join(root, name)
                if not name.endswith(".rs") or os.path.relpath(path, src) == "main.rs":
                    continue
                with open(path, encoding="utf-8") as f:
                    toks = list(tokens(strip(f.read())))
                m = module_of(src, path)
                self.files[m] = File(m, os.path.relpath(path, os.path.dirname(src)), toks)
        self.modules = set(self.files)

    def absolute(self, scope, path):
        """`path` as written in a file whose (inline-module) scope is `scope` → an absolute path,
        or None when it does not start at one of our modules."""
        if not path:
            return None
        head = path[0]
        if head in ("crate", "$crate"):
            return tuple(path[1:])
        if head == "self":
            return scope + tuple(path[1:])
        if head == "super":
            base = list(scope)
            rest = list(path)
            while rest and rest[0] == "super":
                if not base:
                    return None
                base.pop()
                rest.pop(0)
            return self.absolute(tuple(base), ["self"] + rest)
        if scope + (head,) in self.modules:
            return scope + tuple(path)
        return None

    def resolve(self, path, seen=None):
        """The deepest module an absolute path names, following re-exports."""
        seen = seen or set()
        mod = ()
        for k, seg in enumerate(path):
            if mod + (seg,) in self.modules:
                mod = mod + (seg,)
                continue
            f = self.files.get(mod)
            target = f.reexports.get(seg) if f else None
            if target is not None and (target, seg) not in seen:
                seen.add((target, seg))
                return self.resolve(tuple(target) + tuple(path[k + 1 :]), seen)
            break
        return mod

    def scan(self):
        """Fills each file's imports, re-exports and references. Twice: the first pass finds
        the inline modules (`mod tests { … }`) and the re-exports every file's paths may go
        through."""
        for _ in range(2):
            for f in [f for f in self.files.values() if f.toks]:
                f.reexports, f.imports, f.refs = {}, {}, []
                self.scan_file(f)

    def scan_file(self, f):
        toks = f.toks
        scope_stack = []  # (depth at which the inline module opened, scope)
        depth = 0
        i = 0
        prev = None
        while i < len(toks):
            t, line = toks[i]
            scope = scope_stack[-1][1] if scope_stack else f.module
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if scope_stack and scope_stack[-1][0] == depth:
                    scope_stack.pop()
            elif t == "mod" and i + 2 < len(toks) and toks[i + 2][0] == "{":
                scope_stack.append((depth, scope + (toks[i + 1][0],)))
                # An inline module's name is a child the file's own paths may start at.
                self.modules.add(scope + (toks[i + 1][0],))
                self.files.setdefault(scope + (toks[i + 1][0],), File(scope, f.path, []))
                depth += 1
                i += 3
                prev = "{"
                continue
            elif t == "use" and prev in KEYWORDS_BEFORE_USE:
                public = prev == "pub" or (
                    prev == ")" and i >= 4 and toks[i - 4][0] == "pub"
                )
                trees = []
                i = parse_use_tree(toks, i + 1, (), trees)
                for path, alias, uline in trees:
                    absolute = self.absolute(scope, list(path))
                    if absolute is None:
                        continue
                    f.refs.append((absolute, uline))
                    if alias == "*" or not absolute:
                        continue
                    name = alias or absolute[-1]
                    f.imports[name] = absolute
                    if public:
                        f.reexports[name] = absolute
                prev = ";"
                continue
            elif (
                t not in ("::",)
                and prev != "::"
                and i + 1 < len(toks)
                and toks[i + 1][0] == "::"
            ):
                path = [t]
                j = i + 1
                while j + 1 < len(toks) and toks[j][0] == "::" and TOKEN.match(
                    toks[j + 1][0]
                ) and re.match(r"\$?[A-Za-z_]", toks[j + 1][0]):
                    path.append(toks[j + 1][0])
                    j += 2
                absolute = self.absolute(scope, path)
                if absolute is None and t in f.imports:
                    absolute = tuple(f.imports[t]) + tuple(path[1:])
                if absolute is not None:
                    f.refs.append((absolute, line))
                prev = path[-1]
                i = j
                continue
            prev = t
            i += 1

    def edges(self):
        """{(from, to): (file, line)} over file modules only, ancestors left out."""
        out = {}
        for f in self.files.values():
            if not f.toks:
                continue  # an inline module's entry: its paths are its file's
            for absolute, line in f.refs:
                to = self.resolve(absolute)
                # An inline module (`mod tests`) is part of its file.
                while to and to not in self.real():
                    to = to[:-1]
                src = f.module
                if to == src or src[: len(to)] == to:
                    continue
                out.setdefault((src, to), (f.path, line))
        return out

    def real(self):
        return {m for m, f in self.files.items() if f.toks}


def cycles(nodes, edges):
    """The strongly connected components with more than one node (Tarjan), each as a cycle
    through all of them when one is found by a walk, else as the component."""
    graph = {n: sorted({b for (a, b) in edges if a == n}) for n in nodes}
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return comps, graph


def shortest_cycle(comp, graph):
    """A shortest cycle through the component's first node, staying inside the component."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph[v]:
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def name(m):
    return "::".join(m) or "crate"


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    graph_wanted = "--graph" in args
    args = [a for a in args if a != "--graph"]
    src = args[0] if args else os.path.join(here, "..", "src")
    crate = Crate(os.path.normpath(src))
    crate.scan()
    edges = crate.edges()
    if graph_wanted:
        for (a, b), (path, line) in sorted(edges.items()):
            print(f"{name(a)} -> {name(b)}  ({path}:{line})")
    comps, graph = cycles(crate.real(), edges)
    if not comps:
        return 0
    for comp in comps:
        cyc = shortest_cycle(comp, graph)
        print(f"import cycle: {' -> '.join(name(m) for m in cyc)}", file=sys.stderr)
        for a, b in zip(cyc, cyc[1:]):
            path, line = edges[(a, b)]
            print(f"  {name(a)} -> {name(b)}  at {path}:{line}", file=sys.stderr)
        if len(comp) > len(cyc) - 1:
            print(f"  (the whole group: {', '.join(name(m) for m in comp)})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
