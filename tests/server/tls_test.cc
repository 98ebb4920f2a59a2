// --tls-cert/--tls-key: the daemon serves HTTPS with a certificate a client
// verifies (a self-signed one made here for 127.0.0.1), and refuses to start
// with files it cannot load.
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <fstream>

#include "server/server_test_util.h"
#include "sync/notifier.h"

namespace deltasync::testing {
namespace {

// Writes a self-signed P-256 certificate for IP 127.0.0.1 and its key.
bool MakeCertificate(const std::string& cert_path, const std::string& key_path) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  bool ok = key && cert;
  if (ok) {
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"), -1, -1,
                               0);
    X509_set_issuer_name(cert, name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1"},
                              std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
      X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
      ok = ok && ext && X509_add_ext(cert, ext, -1);
      X509_EXTENSION_free(ext);
    }
    ok = ok && X509_sign(cert, key, EVP_sha256()) > 0;
  }
  if (ok) {
    FILE* c = std::fopen(cert_path.c_str(), "w");
    FILE* k = std::fopen(key_path.c_str(), "w");
    ok = c && k && PEM_write_X509(c, cert) && PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr);
    if (c) std::fclose(c);
    if (k) std::fclose(k);
  }
  X509_free(cert);
  EVP_PKEY_free(key);
  return ok;
}

TEST(TlsTest, ServesHttpsThatAClientVerifies) {
  TestBucket bucket;
  bucket.Publish(1);
  const std::string cert = bucket.tmp().Sub("cert.pem"), key = bucket.tmp().Sub("key.pem");
  ASSERT_TRUE(MakeCertificate(cert, key));
  ServerOptions options = DaemonOptions(bucket.store());
  options.tls_cert = cert;
  options.tls_key = key;
  options.token = "tls-token";
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);

  httplib::SSLClient client("127.0.0.1", daemon->port());
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(60, 0);
  ASSERT_TRUE(WaitUntil([&] {
    auto r = client.Get("/status");
    return r && r->status == 200 && nlohmann::json::parse(r->body)["version"] == 1;
  }));
  client.set_bearer_token_auth("tls-token");
  auto paused = client.Post("/pause", "", "application/json");
  ASSERT_TRUE(paused);
  EXPECT_EQ(paused->status, 200);

  // The publisher's /notify over HTTPS verifies the replica's certificate:
  // the system's CA store does not trust this self-signed one, so nothing
  // (and no token) is delivered.
  {
    ::testing::internal::CaptureStderr();
    Notifier notifier({"https://127.0.0.1:" + std::to_string(daemon->port())}, "tls-token");
    notifier.Notify(5);
    ASSERT_TRUE(notifier.Flush(60));
    EXPECT_EQ(notifier.delivered(), 0u);
    EXPECT_EQ(notifier.failed(), 1u);
    std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("notify failed"), std::string::npos) << err;
  }

  // Plain HTTP to the TLS port gets no HTTP answer.
  EXPECT_EQ(HttpGet(daemon->address(), "/status").status, 0);
  // Nor does a client that does not trust the certificate.
  httplib::SSLClient untrusting("127.0.0.1", daemon->port());
  untrusting.set_ca_cert_path(key.c_str());  // not a CA bundle: nothing trusted
  untrusting.enable_server_certificate_verification(true);
  EXPECT_FALSE(untrusting.Get("/status"));
}

TEST(TlsTest, UnloadableFilesAreRefusedAtStart) {
  TestBucket bucket;
  const std::string bogus = bucket.tmp().Sub("bogus.pem");
  std::ofstream(bogus) << "not a certificate\n";
  ServerOptions options = DaemonOptions(bucket.store());
  options.listen = "127.0.0.1:0";
  options.tls_cert = bogus;
  options.tls_key = bogus;
  auto server = Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), ErrorCode::kIOError);
  options.tls_key = "";
  EXPECT_EQ(Server::Start(options).status().code(), ErrorCode::kInvalidArgument);
  options.tls_key = bucket.tmp().Sub("missing.pem");
  EXPECT_EQ(Server::Start(options).status().code(), ErrorCode::kIOError);
}

}  // namespace
}  // namespace deltasync::testing
