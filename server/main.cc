// specd: command-line entry point. Subcommands: generate, tokenize (serve and bench come
// with the serving issue).
#include <cstdio>
#include <string_view>

int main(int argc, char** argv) {
  if (argc < 2 || std::string_view(argv[1]) == "--help") {
    std::fprintf(stderr, "usage: specd <generate|tokenize> [flags]\n");
    return argc < 2 ? 2 : 0;
  }
  std::fprintf(stderr, "specd: unknown command '%s'\n", argv[1]);
  return 2;
}
