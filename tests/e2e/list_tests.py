"""Prints the test ids (Class.method) of one unittest module, without importing it (CMake runs
this at configure time; importing would load torch for every module), each followed by
" one_core" when the method or its class is decorated with harness.one_core."""
import ast
import sys


def one_core(node):
    for decorator in node.decorator_list:
        name = decorator.attr if isinstance(decorator, ast.Attribute) else getattr(decorator, "id", "")
        if name == "one_core":
            return True
    return False


tree = ast.parse(open(sys.argv[1], encoding="utf-8").read())
for node in tree.body:
    if isinstance(node, ast.ClassDef):
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name.startswith("test"):
                print(f"{node.name}.{item.name}" + (" one_core" if one_core(node) or one_core(item) else ""))
