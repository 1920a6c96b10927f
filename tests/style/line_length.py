"""Every line of tessera's C, CUDA and header files is at most 120 characters (.clang-format's ColumnLimit; STYLE.md),
counted as characters, not bytes, so that comments may use symbols such as × and ·. Walks the source folders under
the project root given as the only argument, skipping build folders; prints each long line and exits 1 if any."""
import os
import sys

LIMIT = 120
FOLDERS = ("runtime", "kernels", "launcher", "parallel", "tests", "scripts")
SUFFIXES = (".c", ".h", ".cu", ".cuh")


def main():
    root = sys.argv[1]
    long_lines = []
    n_files = 0
    for folder in FOLDERS:
        for here, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = sorted(d for d in dirs if not d.startswith(("build", ".")))
            for name in sorted(files):
                if not name.endswith(SUFFIXES):
                    continue
                path = os.path.join(here, name)
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
