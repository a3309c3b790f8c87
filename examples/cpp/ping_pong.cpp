// ping_pong: the transfer API's ping-pong in two processes, in C++, over
// the RAII wrapper uct_rs.hpp. The same command line, files and messages
// as the C example (examples/c/ping_pong.c), so either may talk to the
// other:
//
//   ping_pong_cpp --first  --me /tmp/a.url --peer /tmp/b.url -t tcp &
//   ping_pong_cpp --second --me /tmp/b.url --peer /tmp/a.url -t tcp
//
// Build: c++ -std=c++17 -I capi/include ping_pong.cpp -L target/debug
//        -luct_rs -Wl,-rpath,target/debug
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include "uct_rs.hpp"

namespace {

const char *const PROG = "ping_pong_cpp";

struct Settings {
    std::string me, peer, transport = "auto", device;
    bool first = false;
    size_t size = 65536;
    unsigned rounds = 100;
    unsigned timeout_s = 30;
    bool manual = false;
    bool quiet = false;
};

/// A bad command line: exit status 2.
struct Usage : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void usage(std::ostream &out) {
    out << "usage: " << PROG << " (--first | --second) --me FILE --peer FILE [options]\n"
        << "\n"
        << "A ping-pong of notified writes between two processes over uct-rs; every\n"
        << "byte of every message is checked. Each side writes its URL and remote key\n"
        << "to --me and reads the other's from --peer (waiting for it). It talks to\n"
        << "the C example too.\n"
        << "\n"
        << "  -f, --first           this side sends the first message (exactly one side)\n"
        << "  -S, --second          this side answers\n"
        << "  -m, --me FILE         where this side publishes its URL and key\n"
        << "  -p, --peer FILE       where the peer publishes its own\n"
        << "  -t, --transport NAME  auto (default), tcp, posix, rc, cma, self\n"
        << "  -d, --device NAME     the device (lo for tcp on loopback; default: first)\n"
        << "  -s, --size BYTES      bytes per message (default 65536)\n"
        << "  -n, --rounds N        round trips (default 100)\n"
        << "  -w, --timeout SEC     longest wait for the peer or a message (default 30)\n"
        << "      --manual          drive progress from the waits (no progress thread)\n"
        << "  -q, --quiet           print only errors and the result line\n"
        << "  -h, --help            this text\n"
        << "\n"
        << "Exit status: 0 every byte verified, 1 a failure (its message on stderr),\n"
        << "2 a bad command line.\n";
}

unsigned long long number(const char *text, const char *what, unsigned long long max) {
    char *end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v == 0 || v > max) {
        throw Usage(std::string(what) + " " + text + ": give a number from 1 to " +
                    std::to_string(max));
    }
    return v;
}

Settings parse_args(int argc, char **argv) {
    static const option longs[] = {
        {"first", no_argument, nullptr, 'f'},   {"second", no_argument, nullptr, 'S'},
        {"me", required_argument, nullptr, 'm'}, {"peer", required_argument, nullptr, 'p'},
        {"transport", required_argument, nullptr, 't'},
        {"device", required_argument, nullptr, 'd'},
        {"size", required_argument, nullptr, 's'},
        {"rounds", required_argument, nullptr, 'n'},
        {"timeout", required_argument, nullptr, 'w'},
        {"manual", no_argument, nullptr, 'M'},  {"quiet", no_argument, nullptr, 'q'},
        {"help", no_argument, nullptr, 'h'},    {nullptr, 0, nullptr, 0},
    };
    Settings s;
    int role = -1;
    int c;
    while ((c = getopt_long(argc, argv, "fSm:p:t:d:s:n:w:qh", longs, nullptr)) != -1) {
        switch (c) {
        case 'f': role = 1; break;
        case 'S': role = 0; break;
        case 'm': s.me = optarg; break;
        case 'p': s.peer = optarg; break;
        case 't': s.transport = optarg; break;
        case 'd': s.device = optarg; break;
        case 's': s.size = number(optarg, "--size", 1ull << 34); break;
        case 'n': s.rounds = number(optarg, "--rounds", 100000000); break;
        case 'w': s.timeout_s = number(optarg, "--timeout", 100000000); break;
        case 'M': s.manual = true; break;
        case 'q': s.quiet = true; break;
        case 'h': usage(std::cout); std::exit(0);
        default: throw Usage("unknown option");
        }
    }
    if (optind < argc) {
        throw Usage(std::string("unexpected argument ") + argv[optind]);
    }
    if (role < 0 || s.me.empty() || s.peer.empty()) {
        throw Usage("give --first or --second, --me FILE and --peer FILE");
    }
    s.first = role == 1;
    return s;
}

/// The byte at offset i of message `round` sent by side `side` (as in C).
unsigned char pattern(unsigned round, int side, size_t i) {
    return static_cast<unsigned char>((i * 31u + round * 7u + unsigned(side) * 101u) ^ 0x5au);
}

/// Publishes the URL and key in `path`, whole: written aside, then renamed.
void publish(const std::string &path, const std::string &url, const std::string &key) {
    std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << "url " << url << "\nkey " << key << "\n";
        f.close();
        if (!f) {
            throw std::runtime_error("cannot write " + tmp);
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        throw std::runtime_error("cannot rename " + tmp + " to " + path + ": " +
                                 std::strerror(errno));
    }
}

/// The peer's URL and key from `path`, waiting up to `timeout_s` for it.
std::pair<std::string, std::string> read_peer(const std::string &path, unsigned timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (access(path.c_str(), F_OK) != 0) {
        if (std::chrono::steady_clock::now() > deadline) {
            throw std::runtime_error(path + " did not appear within " +
                                     std::to_string(timeout_s) +
                                     " s: is the peer running, with --me " + path + "?");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::ifstream f(path);
    std::string line, url, key;
    while (std::getline(f, line)) {
        if (line.rfind("url ", 0) == 0 && url.empty()) {
            url = line.substr(4);
        } else if (line.rfind("key ", 0) == 0 && key.empty()) {
            key = line.substr(4);
        }
    }
    if (url.empty() || key.empty()) {
        throw std::runtime_error(path + " lacks a 'url' or 'key' line: not written by ping_pong?");
    }
    return {url, key};
}

int run(const Settings &s) {
    uct_rs::Transport::Options opts;
    opts.transport = s.transport;
    opts.device = s.device;
    opts.manual_progress = s.manual;
    // A stale file of an earlier run must not be read by the peer.
    unlink(s.me.c_str());
    uct_rs::Transport t(opts);
    // Declared after the transport: destroyed before it, and after the
    // requests (each waited for), so that every free succeeds.
    uct_rs::Memory src = uct_rs::Memory::alloc(t, s.size);
    uct_rs::Memory dst = uct_rs::Memory::alloc(t, s.size);
    uct_rs::View view = src.whole();
    unsigned char *src_bytes = src.data();
    const unsigned char *dst_bytes = dst.data();
    std::fill(src_bytes, src_bytes + s.size, 0);

    publish(s.me, t.bind(), dst.remote_key());
    auto [peer_url, peer_key] = read_peer(s.peer, s.timeout_s);
    t.connect(peer_url);
    uct_rs::Remote remote = uct_rs::Remote::parse(peer_key);
    std::string name = t.name();
    if (!s.quiet) {
        std::cout << PROG << ": " << (s.first ? "first" : "second") << " side connected over "
                  << name << "; " << s.rounds << " round trips of " << s.size << " bytes"
                  << std::endl;
    }
    const std::chrono::milliseconds timeout(std::chrono::seconds(s.timeout_s));
    auto send = [&](unsigned round) {
        for (size_t i = 0; i < s.size; i++) {
            src_bytes[i] = pattern(round, s.first, i);
        }
        t.write(view, remote, round).wait(timeout);
    };
    auto receive = [&](unsigned round) {
        uct_rs::Notification n = t.wait_for_write(timeout);
        if (n.tag != round || n.length != s.size) {
            throw std::runtime_error("round " + std::to_string(round) +
                                     ": the notification says tag " + std::to_string(n.tag) +
                                     " and " + std::to_string(n.length) + " bytes, expected " +
                                     std::to_string(s.size) + " bytes");
        }
        for (size_t i = 0; i < s.size; i++) {
            if (dst_bytes[i] != pattern(round, !s.first, i)) {
                throw std::runtime_error("round " + std::to_string(round) + ": byte " +
                                         std::to_string(i) + " is " +
                                         std::to_string(dst_bytes[i]) + ", expected " +
                                         std::to_string(pattern(round, !s.first, i)));
            }
        }
    };
    auto start = std::chrono::steady_clock::now();
    try {
        for (unsigned round = 0; round < s.rounds; round++) {
            if (s.first) {
                send(round);
                receive(round);
            } else {
                receive(round);
                send(round);
            }
        }
    } catch (...) {
        // A failed wait leaves its write in flight: destroying the
        // transport first ends it, so the Memory destructors free.
        t.destroy();
        throw;
    }
    std::chrono::duration<double, std::micro> took = std::chrono::steady_clock::now() - start;
    std::printf("%s: %s side: %u round trips of %zu bytes over %s, every byte verified "
                "(%.1f us per round trip)\n",
                PROG, s.first ? "first" : "second", s.rounds, s.size, name.c_str(),
                took.count() / s.rounds);
    return 0;
}

} // namespace

int main(int argc, char **argv) {
    Settings s;
    try {
        s = parse_args(argc, argv);
    } catch (const Usage &e) {
        std::cerr << PROG << ": " << e.what() << "\ntry '" << PROG << " --help'\n";
        return 2;
    }
    try {
        return run(s);
    } catch (const uct_rs::Error &e) {
        std::cerr << PROG << ": " << e.what() << "\n";
    } catch (const std::exception &e) {
        std::cerr << PROG << ": " << e.what() << "\n";
    }
    return 1;
}
