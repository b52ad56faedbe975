"""Prints the test ids (Class.method) of one unittest module, without importing it (CMake runs
this at configure time; importing would load torch for every module)."""
import ast
import sys

tree = ast.parse(open(sys.argv[1], encoding="utf-8").read())
for node in tree.body:
    if isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                print(f"{node.name}.{item.name}")
