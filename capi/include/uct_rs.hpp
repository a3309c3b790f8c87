// uct_rs.hpp: a C++17 wrapper of uct_rs.h. Classes own the handles (move
// only; the destructor frees), and a failed call throws uct_rs::Error,
// which carries the status and the library's message.
//
// Ownership follows the C API: a Memory outlives its Views only as
// handles (a View of a freed Memory throws when used), a Request's
// destructor frees the request but not the operation, which goes on.
// Wait for your requests before their Memory goes out of scope. The
// destructor of a Memory made by register_memory waits for the requests
// still using it (uct_rs_mem_free_wait, no timeout) and then deregisters
// it, so the caller's bytes are never freed while a peer or the NIC may
// still touch them (an exception unwinding past both is safe). The
// destructor of an allocated Memory does not wait: while a request uses
// it, the library keeps it allocated (safe, but it leaks).
//
// Thread-safety is the C API's: every call may be made from any thread.
#ifndef UCT_RS_HPP
#define UCT_RS_HPP

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "uct_rs.h"

namespace uct_rs {

/// A failed call: its status and the library's message
/// ("uct_rs_transport_connect: ...").
class Error : public std::runtime_error {
public:
    Error(uct_rs_status status, const std::string &message)
        : std::runtime_error(message), status_(status) {}

    /// The status the call returned.
    uct_rs_status status() const noexcept { return status_; }

private:
    uct_rs_status status_;
};

/// A timeout meaning "for ever".
inline constexpr std::chrono::milliseconds forever{-1};

namespace detail {

/// Throws Error unless `s` is UCT_RS_OK or UCT_RS_IN_PROGRESS.
inline uct_rs_status check(uct_rs_status s) {
    if (s != UCT_RS_OK && s != UCT_RS_IN_PROGRESS) {
        throw Error(s, std::string(uct_rs_status_name(s)) + ": " + uct_rs_last_error());
    }
    return s;
}

/// Copies a string uct-rs returned, and frees it.
inline std::string take(char *s) {
    std::string copy(s);
    uct_rs_string_free(s);
    return copy;
}

/// Frees registered memory once its requests are done: a destructor must
/// not leave the caller's bytes registered after it returns.
inline uct_rs_status mem_free_waiting(uct_rs_memory *m) { return uct_rs_mem_free_wait(m, -1); }

/// Owns a handle of type H, freed with Free.
template <typename H, uct_rs_status (*Free)(H *)> class Owned {
public:
    Owned() = default;
    explicit Owned(H *h) : h_(h) {}
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;
    Owned(Owned &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Owned &operator=(Owned &&o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Owned() { reset(); }

    /// The C handle (still owned here).
    H *get() const noexcept { return h_; }

    /// Gives the handle up without freeing it (freed elsewhere).
    H *release() noexcept { return std::exchange(h_, nullptr); }

    /// Frees the handle now; throws if the library refuses (UCT_RS_ERR_BUSY),
    /// and keeps it then.
    void free() {
        if (h_ != nullptr) {
            check(Free(h_));
            h_ = nullptr;
        }
    }

private:
    void reset() noexcept {
        if (h_ != nullptr) {
            // A destructor cannot throw: a refusal leaves the handle
            // allocated (see the top of this file).
            (void)Free(h_);
            h_ = nullptr;
        }
    }

    H *h_ = nullptr;
};

} // namespace detail

/// The library's version.
inline std::string version() {
    const char *v = nullptr;
    detail::check(uct_rs_version(&v));
    return v;
}

/// Whether this machine can connect two processes at all.
inline bool supported() {
    bool s = false;
    detail::check(uct_rs_supported(&s));
    return s;
}

class Transport;
class Memory;

/// A range of a Memory: what writes send from and reads land in.
class View {
public:
    uct_rs_view *get() const noexcept { return h_.get(); }

private:
    friend class Memory;
    explicit View(uct_rs_view *h) : h_(h) {}
    detail::Owned<uct_rs_view, uct_rs_view_free> h_;
};

/// A peer's memory (or a slice of it), from its remote key.
class Remote {
public:
    /// Reads the key the peer's Memory::remote_key gave.
    static Remote parse(const std::string &key) {
        uct_rs_remote *h = nullptr;
        detail::check(uct_rs_remote_parse(key.c_str(), &h));
        return Remote(h);
    }

    /// `length` bytes from `offset`.
    Remote slice(size_t offset, size_t length) const {
        uct_rs_remote *h = nullptr;
        detail::check(uct_rs_remote_slice(get(), offset, length, &h));
        return Remote(h);
    }

    /// The peer's address, the length, the type and the rights.
    uct_rs_region_info info() const {
        uct_rs_region_info i{};
        detail::check(uct_rs_remote_info(get(), &i));
        return i;
    }

    uct_rs_remote *get() const noexcept { return h_.get(); }

private:
    explicit Remote(uct_rs_remote *h) : h_(h) {}
    detail::Owned<uct_rs_remote, uct_rs_remote_free> h_;
};

/// A write, read or flush in flight or done.
class Request {
public:
    /// True once it completed; throws its error if it failed.
    bool test() { return detail::check(uct_rs_request_test(get())) == UCT_RS_OK; }

    /// Waits until it completed (throws its error, or Error with
    /// UCT_RS_ERR_TIMED_OUT after `timeout`: it goes on).
    void wait(std::chrono::milliseconds timeout = forever) {
        detail::check(uct_rs_request_wait(get(), timeout.count()));
    }

    uct_rs_request *get() const noexcept { return h_.get(); }

private:
    friend class Transport;
    explicit Request(uct_rs_request *h) : h_(h) {}
    detail::Owned<uct_rs_request, uct_rs_request_free> h_;
};

/// What a notified write tells its receiver.
struct Notification {
    size_t length;
    uint32_t tag;
};

/// One side of a connection.
class Transport {
public:
    /// The settings (uct_rs_transport_options).
    struct Options {
        std::string transport = "auto";
        std::string device; ///< empty: the first one
        std::vector<uct_rs_memory_type> memory_types; ///< empty: host
        bool manual_progress = false;
        size_t max_in_flight = 0;            ///< 0: the default
        size_t max_notification_backlog = 0; ///< 0: the default
    };

    Transport() : Transport(Options{}) {}

    explicit Transport(const Options &o) {
        uct_rs_transport_options opts;
        detail::check(uct_rs_transport_options_init(&opts));
        opts.transport = o.transport.c_str();
        opts.device = o.device.empty() ? nullptr : o.device.c_str();
        opts.memory_types = o.memory_types.empty() ? nullptr : o.memory_types.data();
        opts.num_memory_types = o.memory_types.size();
        opts.progress = o.manual_progress ? UCT_RS_PROGRESS_MANUAL : UCT_RS_PROGRESS_THREAD;
        opts.max_in_flight = o.max_in_flight;
        opts.max_notification_backlog = o.max_notification_backlog;
        uct_rs_transport *h = nullptr;
        detail::check(uct_rs_transport_create(&opts, &h));
        h_ = Handle(h);
    }

    /// The URL for the peer's connect.
    std::string bind() {
        char *url = nullptr;
        detail::check(uct_rs_transport_bind(get(), &url));
        return detail::take(url);
    }

    /// Connects to the peer whose bind gave `peer_url`.
    void connect(const std::string &peer_url) {
        detail::check(uct_rs_transport_connect(get(), peer_url.c_str()));
    }

    /// The transport connected over.
    std::string name() {
        char *n = nullptr;
        detail::check(uct_rs_transport_name(get(), &n));
        return detail::take(n);
    }

    /// Drives progress once; the events handled.
    size_t progress() {
        size_t n = 0;
        detail::check(uct_rs_transport_progress(get(), &n));
        return n;
    }

    uct_rs_stats stats() {
        uct_rs_stats s{};
        detail::check(uct_rs_transport_stats(get(), &s));
        return s;
    }

    /// Writes `local` to `remote` (same length); with a tag, the peer is
    /// notified once the bytes have landed.
    Request write(const View &local, const Remote &remote,
                  std::optional<uint32_t> notify_tag = std::nullopt) {
        uct_rs_request *r = nullptr;
        detail::check(uct_rs_write(get(), local.get(), remote.get(),
                                   notify_tag ? UCT_RS_WRITE_NOTIFY : 0u,
                                   notify_tag.value_or(0), &r));
        return Request(r);
    }

    /// Reads `remote` into `local` (same length).
    Request read(const View &local, const Remote &remote) {
        uct_rs_request *r = nullptr;
        detail::check(uct_rs_read(get(), local.get(), remote.get(), &r));
        return Request(r);
    }

    /// Completes once everything posted before it has.
    Request flush() {
        uct_rs_request *r = nullptr;
        detail::check(uct_rs_flush(get(), &r));
        return Request(r);
    }

    /// The peer's next notified write (Error UCT_RS_ERR_TIMED_OUT after
    /// `timeout`).
    Notification wait_for_write(std::chrono::milliseconds timeout = forever) {
        uct_rs_notification n{};
        detail::check(uct_rs_wait_for_write(get(), timeout.count(), &n));
        return {n.length, n.tag};
    }

    /// The peer's next notified write if one has come.
    std::optional<Notification> test_for_write() {
        uct_rs_notification n{};
        if (detail::check(uct_rs_test_for_write(get(), &n)) == UCT_RS_IN_PROGRESS) {
            return std::nullopt;
        }
        return Notification{n.length, n.tag};
    }

    /// Destroys it now: its requests in flight end (UCT_RS_ERR_CLOSED), so
    /// the Memory made from it can be freed; that and its other objects
    /// are still to be freed. The way out after a failure.
    void destroy() { h_.free(); }

    uct_rs_transport *get() const noexcept { return h_.get(); }

private:
    using Handle = detail::Owned<uct_rs_transport, uct_rs_transport_destroy>;
    Handle h_;
};

/// Memory registered with a Transport.
class Memory {
public:
    /// Allocates `length` bytes that peers get `rights` on.
    static Memory alloc(Transport &t, size_t length,
                        uct_rs_memory_type type = UCT_RS_MEMORY_HOST,
                        uint32_t rights = UCT_RS_REMOTE_ALL) {
        uct_rs_memory *h = nullptr;
        detail::check(uct_rs_mem_alloc(t.get(), type, length, rights, &h));
        return allocated(h);
    }

    /// Registers the caller's memory, which must stay allocated until this
    /// Memory is freed (see uct_rs_mem_register).
    static Memory register_memory(Transport &t, void *address, size_t length,
                                  uct_rs_memory_type type = UCT_RS_MEMORY_HOST,
                                  uint32_t rights = UCT_RS_REMOTE_ALL) {
        uct_rs_memory *h = nullptr;
        detail::check(uct_rs_mem_register(t.get(), address, length, type, rights, &h));
        return registered(h);
    }

    uct_rs_region_info info() const {
        uct_rs_region_info i{};
        detail::check(uct_rs_mem_info(get(), &i));
        return i;
    }

    /// Its bytes, for host memory.
    unsigned char *data() const {
        return reinterpret_cast<unsigned char *>(static_cast<uintptr_t>(info().address));
    }

    size_t size() const { return info().length; }

    /// The key the peer passes to Remote::parse.
    std::string remote_key() const {
        char *k = nullptr;
        detail::check(uct_rs_mem_remote_key(get(), &k));
        return detail::take(k);
    }

    View view(size_t offset, size_t length) const {
        uct_rs_view *v = nullptr;
        detail::check(uct_rs_mem_view(get(), offset, length, &v));
        return View(v);
    }

    View whole() const { return view(0, size()); }

    /// Frees it now; throws Error UCT_RS_ERR_BUSY while a request uses it.
    void free() {
        allocated_.free();
        registered_.free();
    }

    /// Frees it once the requests using it are done; throws Error
    /// UCT_RS_ERR_TIMED_OUT (and keeps it) if they are not by `timeout`.
    void free_wait(std::chrono::milliseconds timeout = forever) {
        if (uct_rs_memory *h = get()) {
            detail::check(uct_rs_mem_free_wait(h, timeout.count()));
            // Freed: the owners must not free it again.
            (void)allocated_.release();
            (void)registered_.release();
        }
    }

    uct_rs_memory *get() const noexcept {
        return allocated_.get() != nullptr ? allocated_.get() : registered_.get();
    }

private:
    static Memory allocated(uct_rs_memory *h) {
        Memory m;
        m.allocated_ = detail::Owned<uct_rs_memory, uct_rs_mem_free>(h);
        return m;
    }
    static Memory registered(uct_rs_memory *h) {
        Memory m;
        m.registered_ = detail::Owned<uct_rs_memory, detail::mem_free_waiting>(h);
        return m;
    }
    Memory() = default;

    // One of the two holds the handle: registered memory is freed by a
    // destructor that waits, so the caller's bytes outlive every access.
    detail::Owned<uct_rs_memory, uct_rs_mem_free> allocated_;
    detail::Owned<uct_rs_memory, detail::mem_free_waiting> registered_;
};

} // namespace uct_rs

#endif // UCT_RS_HPP
