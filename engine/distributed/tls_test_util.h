// Test certificates for the SSD link's TLS, made once per test program by the openssl CLI in a
// temporary directory: CA "ca" signs "verifier" (subjectAltName IP 127.0.0.1 and DNS
// verifier.test) and "speculator"; CA "rogue-ca" signs "rogue". Test code only.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/distributed/tls.h"

namespace specd::distributed_test {

// A directory of PEM files made once for the whole test program.
class Certificates {
 public:
  static const Certificates& Get() {
    static const Certificates* certs = new Certificates();
    return *certs;
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  TlsFiles Files(const std::string& who, const std::string& ca) const {
    return TlsFiles{Path(who + ".pem"), Path(who + ".key"), Path(ca + ".pem")};
  }
  bool ok() const { return ok_; }

 private:
  Certificates() {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/specd_tls_test_", ::getpid());
    std::ofstream(dir_ + ".sh") << Script();
    ok_ = std::system(("sh " + dir_ + ".sh >" + dir_ + ".log 2>&1").c_str()) == 0;
  }
  // CA "ca" signs "verifier" (subjectAltName IP 127.0.0.1) and "speculator"; CA "rogue-ca"
  // signs "rogue".
  std::string Script() const {
    const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    std::string s = absl::StrCat("set -e\nrm -rf ", dir_, "\nmkdir -p ", dir_, "\ncd ", dir_, "\n",
                                 "printf 'subjectAltName=IP:127.0.0.1,DNS:verifier.test\\n' > "
                                 "san.ext\nprintf 'subjectAltName=DNS:speculator.test\\n' > "
                                 "client.ext\n");
    for (const char* ca : {"ca", "rogue-ca"}) {
      absl::StrAppend(&s, "openssl req -x509 ", key, " -keyout ", ca, ".key -out ", ca,
                      ".pem -days 2 -subj /CN=", ca, "\n");
    }
    const char* leaves[][3] = {{"verifier", "ca", "san.ext"},
                               {"speculator", "ca", "client.ext"},
                               {"rogue", "rogue-ca", "client.ext"}};
    for (const auto& [who, ca, ext] : leaves) {
      absl::StrAppend(&s, "openssl req ", key, " -keyout ", who, ".key -out ", who,
                      ".csr -subj /CN=", who, "\nopenssl x509 -req -in ", who, ".csr -CA ", ca,
                      ".pem -CAkey ", ca, ".key -CAcreateserial -days 2 -extfile ", ext, " -out ",
                      who, ".pem\n");
    }
    return s;
  }
  std::string dir_;
  bool ok_ = false;
};

}  // namespace specd::distributed_test
