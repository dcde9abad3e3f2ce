// SPDX-License-Identifier: Apache-2.0
// Test helper: a throwaway CA, server and client certificates made with the
// openssl CLI in a temporary directory (removed on destruction).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace rltest {

/// Certificates for TLS tests (EC P-256 keys: quick to make):
/// - ca: the trusted CA; other_ca: a CA the client does not trust
/// - server: signed by ca for DNS:localhost, IP:127.0.0.1 and IP:::1, valid 2 days
/// - expired: the same names, signed by ca, expired yesterday
/// - stranger: the same names, signed by other_ca
/// - client: a client certificate signed by ca
class tls_certs {
 public:
  tls_certs() {
    char tmpl[] = "/tmp/rltest-tls.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = tmpl;
    ca("ca");
    ca("other_ca");
    leaf("server", "ca", "2", "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1");
    leaf("expired", "ca", "-1", "subjectAltName=DNS:localhost,IP:127.0.0.1");
    leaf("stranger", "other_ca", "2", "subjectAltName=DNS:localhost,IP:127.0.0.1");
    leaf("client", "ca", "2", "extendedKeyUsage=clientAuth");
  }
  tls_certs(const tls_certs&) = delete;
  tls_certs& operator=(const tls_certs&) = delete;
  ~tls_certs() {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
  }

  /// `<dir>/<name>.crt`, `<dir>/<name>.key`.
  [[nodiscard]] std::string crt(const std::string& name) const {
    return dir_ + "/" + name + ".crt";
  }
  [[nodiscard]] std::string key(const std::string& name) const {
    return dir_ + "/" + name + ".key";
  }
  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

  /// Makes one more certificate `name` (CN=localhost) signed by `signer`,
  /// valid `days`, with the extensions `ext` (an openssl extfile line).
  void make(const std::string& name, const std::string& signer, const std::string& days,
            const std::string& ext) const {
    leaf(name, signer, days, ext);
  }

  /// redis-server arguments serving certificate `name` (clients not asked
  /// for certificates; `CONFIG SET tls-auth-clients yes` turns that on).
  [[nodiscard]] std::vector<std::string> server_args(const std::string& name) const {
    return {"--tls-cert-file",    crt(name), "--tls-key-file",     key(name),
            "--tls-ca-cert-file", crt("ca"), "--tls-auth-clients", "no"};
  }

 private:
  void run(const std::vector<std::string>& args) const {
    std::string cmd = "openssl";
    for (const std::string& a : args) cmd += " '" + a + "'";
    cmd += " >/dev/null 2>&1";
    const int rc = std::system(cmd.c_str());
    if (rc == -1 || !WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
      throw std::runtime_error("openssl failed: " + cmd);
    }
  }
  void ca(const std::string& name) const {
    run({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key(name), "-out", crt(name), "-days", "2", "-subj", "/CN=rltest " + name});
  }
  void leaf(const std::string& name, const std::string& signer, const std::string& days,
            const std::string& ext) const {
    const std::string csr = dir_ + "/" + name + ".csr";
    const std::string extfile = dir_ + "/" + name + ".ext";
    std::ofstream(extfile) << ext << "\n";
    run({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key(name), "-out", csr, "-subj", "/CN=localhost"});
    run({"x509", "-req", "-in", csr, "-CA", crt(signer), "-CAkey", key(signer), "-CAcreateserial",
         "-out", crt(name), "-days", days, "-extfile", extfile});
  }

  std::string dir_;
};

}  // namespace rltest
