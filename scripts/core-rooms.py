#!/usr/bin/env python3
"""The rooms of baton-core and the imports between them.

A room is a top-level module of crates/baton-core/src (a folder or a
file); room A imports room B when code in A names `crate::B`. Comments are
not read, so a doc link is no import. Prints each import with how many
files make it, the floors (a room stands above every room it imports) and
the circles (rooms that import each other in a loop); with --dot, writes
the graph in Graphviz's language instead, circles in red, each arrow
labelled with the number of files that make it when more than one:

    python3 scripts/core-rooms.py
    python3 scripts/core-rooms.py --dot | dot -Tpng -o docs/core-rooms-after.png

--src names another tree (an older checkout, say). Standard library only.
"""

import argparse
import collections
import os
import re
import sys

PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def room_of(src, path):
    """The top-level module a file belongs to, or None for lib.rs."""
    first = os.path.relpath(path, src).split(os.sep)[0]
    name = first[:-3] if first.endswith(".rs") else first
    return None if name == "lib" else name


def code_of(text):
    """The text without line comments, so doc links are not read as imports."""
    return "\n".join(line.split("//", 1)[0] for line in text.split("\n"))


def imports(src):
    """{room: {imported room: number of files}} over every .rs file under src."""
    rooms = collections.defaultdict(collections.Counter)
    for folder, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(folder, name)
            room = room_of(src, path)
            if room is None:
                continue
            rooms[room]
            with open(path, encoding="utf-8") as f:
                named = set(PATH.findall(code_of(f.read())))
            for other in named - {room}:
                rooms[room][other] += 1
    return rooms


def circles(rooms):
    """Strongly connected sets of more than one room (Tarjan, iterative)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    for start in sorted(rooms):
        if start in index:
            continue
        work = [(start, iter(sorted(rooms[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(rooms[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def floors(rooms, groups):
    """Floor of each room: 1 + the highest floor it imports; a circle is one floor."""
    home = {room: room for room in rooms}
    for group in groups:
        for room in group:
            home[room] = group[0]
    memo = {}

    def floor(room):
        key = home[room]
        if key not in memo:
            memo[key] = 0
            members = [r for r in rooms if home[r] == key]
            below = [floor(o) for r in members for o in rooms[r] if home[o] != key]
            memo[key] = 1 + max(below, default=0)
        return memo[key]

    return {room: floor(room) for room in rooms}


def dot(rooms, groups, floor_of):
    in_circle = {room for group in groups for room in group}
    lines = ["digraph core {", "  rankdir=BT;", '  node [shape=box, fontname="sans-serif"];', '  edge [fontname="sans-serif"];']
    # Rooms on one floor stand in one row, but for a circle's: those are
    # left for Graphviz to spread, or one row would hold them all.
    for level in sorted(set(floor_of.values())):
        names = " ".join(f'"{r}"' for r in sorted(rooms) if floor_of[r] == level and r not in in_circle)
        if names:
            lines.append(f"  {{ rank=same; {names} }}")
    for room in sorted(rooms):
        colour = ', color="red"' if room in in_circle else ""
        lines.append(f'  "{room}" [label="{room}\\nfloor {floor_of[room]}"{colour}];')
    for room in sorted(rooms):
        for other, files in sorted(rooms[room].items()):
            looped = any(room in g and other in g for g in groups)
            style = ', color="red"' if looped else ""
            label = f'label="{files}", ' if files > 1 else ""
            lines.append(f'  "{room}" -> "{other}" [{label}fontsize=10{style}];')
    lines.append("}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default="crates/baton-core/src")
    parser.add_argument("--dot", action="store_true")
    args = parser.parse_args()
    rooms = imports(args.src)
    for room in list(rooms):
        for other in rooms[room]:
            rooms[other]
    groups = circles(rooms)
    floor_of = floors(rooms, groups)
    if args.dot:
        print(dot(rooms, groups, floor_of))
        return 0
    for room in sorted(rooms, key=lambda r: (-floor_of[r], r)):
        named = ", ".join(f"{o} ({n})" for o, n in sorted(rooms[room].items()))
        print(f"floor {floor_of[room]:2}  {room}: {named or '-'}")
    pairs = sum(len(v) for v in rooms.values())
    print(f"rooms {len(rooms)}, floors {max(floor_of.values(), default=0)}, imports {pairs}, circles {len(groups)}")
    for group in groups:
        print("circle: " + ", ".join(group))
    return 0


if __name__ == "__main__":
    sys.exit(main())
