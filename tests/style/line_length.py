"""Every line of tessera's C, CUDA and header files is at most 120 characters (.clang-format's ColumnLimit; STYLE.md),
and so is every line of its shell and Python scripts (.sh, .py, and executables without a suffix that start with
"#!", such as .ci/run), counted as characters, not bytes, so that comments may use symbols such as × and ·. Walks
the source folders under the project root given as the only argument, skipping build folders and hidden folders
below them; prints each long line and exits 1 if any."""
import os
import sys

LIMIT = 120
FOLDERS = ("runtime", "kernels", "launcher", "parallel", "tests", "scripts", ".ci")
SUFFIXES = (".c", ".h", ".cu", ".cuh", ".sh", ".py")


def checked(path, name):
    """Whether the limit applies to the file: a source suffix, or an executable script without one ("#!" first;
    the fuzz corpora's files have no suffix either, but are not executable)."""
    if name.endswith(SUFFIXES):
        return True
    if "." in name or not os.access(path, os.X_OK):
        return False
    with open(path, "rb") as f:
        return f.read(2) == b"#!"


def main():
    root = sys.argv[1]
    long_lines = []
    n_files = 0
    for folder in FOLDERS:
        for here, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("build", ".")))
            for name in sorted(files):
                path = os.path.join(here, name)
                if not checked(path, name):
                    continue
                n_files += 1
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        width = len(line.rstrip("\n"))
                        if width > LIMIT:
                            long_lines.append(f"{os.path.relpath(path, root)}:{number}: {width} characters")
    if n_files == 0:
        print(f"line_length: no source files under {root}")
        return 1
    for entry in long_lines:
        print(entry)
    print(f"line_length: {n_files} files, {len(long_lines)} lines over {LIMIT} characters")
    return 1 if long_lines else 0


if __name__ == "__main__":
    sys.exit(main())
