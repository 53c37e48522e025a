// Stall watching (`StallMonitor`): what each thread runs, since when, and per-queue counts.
//
// Off, the package pays one relaxed load of `cgcd_stall_watching` per submission or run (the
// check that picks the watched path). On, every piece of work the package runs records, on its
// own thread's record and without a lock, its queue's label, its site and its start; the monitor
// thread reads the records (a sequence lock per record: a torn read is retried, never used).
#define _GNU_SOURCE
#include "CGCD.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int cgcd_stall_watching = 0;

extern const char *cgcd_queue_get_label(void *queue) __asm__("dispatch_queue_get_label");
extern void cgcd_stall_dispatch_async_f(void *queue, void *context, void (*work)(void *)) __asm__("dispatch_async_f");

uint64_t cgcd_stall_now(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
}

void cgcd_stall_set_watching(int on) { __atomic_store_n(&cgcd_stall_watching, on, __ATOMIC_SEQ_CST); }

// MARK: - Thread records

#define CGCD_STALL_LABEL_WORDS 6  // 47 characters and the terminator

struct cgcd_stall_entry {
  _Atomic(uint64_t) start;
  _Atomic(uint64_t) submitted;
  _Atomic(uintptr_t) site;
  _Atomic(uintptr_t) queue;
  _Atomic(uintptr_t) row;  // the queue's statistics row at the start (NULL: none)
  _Atomic(uint64_t) label[CGCD_STALL_LABEL_WORDS];
  // The last piece of work that ended at this depth: its start and its end.
  _Atomic(uint64_t) ended_start;
  _Atomic(uint64_t) ended_at;
};

struct cgcd_stall_thread {
  struct cgcd_stall_thread *next;  // the global list: set once, before the record is published
  _Atomic(int) in_use;
  _Atomic(int) tid;
  _Atomic(uint32_t) sequence;  // odd while the owner writes
  _Atomic(uint32_t) depth;     // entries in use (more nested work than entries is counted only)
  struct cgcd_stall_entry entries[CGCD_STALL_DEPTH];
};

static _Atomic(struct cgcd_stall_thread *) cgcd_stall_threads = NULL;
static _Atomic(uint32_t) cgcd_stall_thread_count = 0;
static __thread struct cgcd_stall_thread *cgcd_stall_self __attribute__((tls_model("initial-exec"))) = NULL;
static pthread_key_t cgcd_stall_key;
static pthread_once_t cgcd_stall_key_once = PTHREAD_ONCE_INIT;

// A thread that ends gives its record back for the next new thread (libdispatch's workers come
// and go): records are never freed, so the monitor's reads never touch freed memory.
static void cgcd_stall_thread_ended(void *record) {
  struct cgcd_stall_thread *thread = record;
  // Forgotten first: watched work that a later destructor of this thread runs takes a record
  // again (and this destructor runs again for it), never writes into one another thread claimed.
  cgcd_stall_self = NULL;
  atomic_store_explicit(&thread->depth, 0, memory_order_release);
  atomic_store_explicit(&thread->in_use, 0, memory_order_release);
}

static void cgcd_stall_make_key(void) { pthread_key_create(&cgcd_stall_key, cgcd_stall_thread_ended); }

static struct cgcd_stall_thread *cgcd_stall_thread_record(void) {
  struct cgcd_stall_thread *thread = cgcd_stall_self;
  if (__builtin_expect(thread != NULL, 1)) return thread;
  pthread_once(&cgcd_stall_key_once, cgcd_stall_make_key);
  for (thread = atomic_load_explicit(&cgcd_stall_threads, memory_order_acquire); thread != NULL;
       thread = thread->next) {
    int free_record = 0;
    if (atomic_compare_exchange_strong(&thread->in_use, &free_record, 1)) break;
  }
  if (thread == NULL) {
    thread = calloc(1, sizeof *thread);
    if (thread == NULL) abort();
    atomic_store_explicit(&thread->in_use, 1, memory_order_relaxed);
    struct cgcd_stall_thread *head = atomic_load_explicit(&cgcd_stall_threads, memory_order_relaxed);
    do {
      thread->next = head;
    } while (!atomic_compare_exchange_weak_explicit(&cgcd_stall_threads, &head, thread, memory_order_release,
                                                    memory_order_relaxed));
    atomic_fetch_add_explicit(&cgcd_stall_thread_count, 1, memory_order_relaxed);
  }
  atomic_store_explicit(&thread->tid, (int)syscall(SYS_gettid), memory_order_relaxed);
  atomic_store_explicit(&thread->depth, 0, memory_order_relaxed);
  pthread_setspecific(cgcd_stall_key, thread);
  cgcd_stall_self = thread;
  return thread;
}

static inline void cgcd_stall_write_begin(struct cgcd_stall_thread *thread) {
  uint32_t sequence = atomic_load_explicit(&thread->sequence, memory_order_relaxed);
  atomic_store_explicit(&thread->sequence, sequence + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

static inline void cgcd_stall_write_end(struct cgcd_stall_thread *thread) {
  uint32_t sequence = atomic_load_explicit(&thread->sequence, memory_order_relaxed);
  atomic_store_explicit(&thread->sequence, sequence + 1, memory_order_release);
}

// MARK: - Per-queue statistics

#define CGCD_STALL_QUEUES 512

struct cgcd_stall_queue {
  _Atomic(uintptr_t) queue;  // 0: free; 1: being filled or reset
  _Atomic(uint64_t) submitted, started, completed;
  _Atomic(uint32_t) wait_max, run_max;  // microseconds
  _Atomic(uint32_t) last_used;          // CLOCK_MONOTONIC milliseconds, wrapping: for the eviction
  _Atomic(uint32_t) wait[CGCD_STALL_BUCKETS], run[CGCD_STALL_BUCKETS];
  _Atomic(uint64_t) label[CGCD_STALL_LABEL_WORDS];
};

_Static_assert(sizeof(struct cgcd_stall_queue) <= 256, "a watched queue's row takes at most 256 bytes");

static struct cgcd_stall_queue cgcd_stall_queues[CGCD_STALL_QUEUES];

static inline void cgcd_stall_copy_label(_Atomic(uint64_t) *words, void *queue) {
  const char *label = cgcd_queue_get_label(queue);
  if (label == NULL) label = "";
  size_t length = strnlen(label, CGCD_STALL_LABEL_WORDS * 8 - 1);
  uint64_t buffer[CGCD_STALL_LABEL_WORDS] = {0};
  memcpy(buffer, label, length);
  for (int index = 0; index < CGCD_STALL_LABEL_WORDS; index++) {
    atomic_store_explicit(&words[index], buffer[index], memory_order_relaxed);
  }
}

static inline void cgcd_stall_read_label(_Atomic(uint64_t) *words, char *out) {
  uint64_t buffer[CGCD_STALL_LABEL_WORDS];
  for (int index = 0; index < CGCD_STALL_LABEL_WORDS; index++) {
    buffer[index] = atomic_load_explicit(&words[index], memory_order_relaxed);
  }
  memcpy(out, buffer, sizeof buffer);
  out[sizeof buffer - 1] = 0;
}

static inline uint32_t cgcd_stall_milliseconds(uint64_t nanoseconds) { return (uint32_t)(nanoseconds / 1000000); }

// Zeroes a row this thread holds (its key is 1).
static void cgcd_stall_reset_row(struct cgcd_stall_queue *row) {
  atomic_store_explicit(&row->submitted, 0, memory_order_relaxed);
  atomic_store_explicit(&row->started, 0, memory_order_relaxed);
  atomic_store_explicit(&row->completed, 0, memory_order_relaxed);
  atomic_store_explicit(&row->wait_max, 0, memory_order_relaxed);
  atomic_store_explicit(&row->run_max, 0, memory_order_relaxed);
  for (int bucket = 0; bucket < CGCD_STALL_BUCKETS; bucket++) {
    atomic_store_explicit(&row->wait[bucket], 0, memory_order_relaxed);
    atomic_store_explicit(&row->run[bucket], 0, memory_order_relaxed);
  }
}

// The queue's row, made on first use (open addressing over the whole table, no lock). When every
// row is taken, the one used least recently is given to this queue, zeroed (its old queue's
// counts start again if it comes back: `statistics()` sees counts go down and starts from zero).
// NULL only when the rows change under it too fast. Called on a thread that runs or submits work
// of `queue`, so the queue is alive for the label.
static struct cgcd_stall_queue *cgcd_stall_queue_row(void *queue, uint32_t now_ms) {
  uintptr_t key = (uintptr_t)queue;
  size_t slot = (key >> 4) * 0x9E3779B97F4A7C15ull >> 55;  // 9 bits: 512 rows
  struct cgcd_stall_queue *free_row = NULL;
  struct cgcd_stall_queue *oldest = NULL;
  uint32_t oldest_age = 0;
  for (size_t probe = 0; probe < CGCD_STALL_QUEUES; probe++) {
    struct cgcd_stall_queue *row = &cgcd_stall_queues[(slot + probe) % CGCD_STALL_QUEUES];
    uintptr_t current = atomic_load_explicit(&row->queue, memory_order_acquire);
    if (current == key) return row;
    if (current == 0) {
      if (free_row == NULL) free_row = row;
    } else if (current != 1) {
      uint32_t age = now_ms - atomic_load_explicit(&row->last_used, memory_order_relaxed);
      if (oldest == NULL || age > oldest_age) {
        oldest = row;
        oldest_age = age;
      }
    }
  }
  struct cgcd_stall_queue *row = free_row != NULL ? free_row : oldest;
  if (row == NULL) return NULL;
  uintptr_t expected = atomic_load_explicit(&row->queue, memory_order_relaxed);
  if (expected == 1 || (expected != 0 && row == free_row)) return NULL;
  if (!atomic_compare_exchange_strong(&row->queue, &expected, 1)) return NULL;
  cgcd_stall_reset_row(row);
  cgcd_stall_copy_label(row->label, queue);
  atomic_store_explicit(&row->last_used, now_ms, memory_order_relaxed);
  atomic_store_explicit(&row->queue, key, memory_order_release);
  return row;
}

static inline unsigned cgcd_stall_bucket(uint64_t nanoseconds) {
  // Bucket 0: under 1 µs; bucket k: [2^(k-1), 2^k) µs; the last one (from 2^18 µs, 262 ms)
  // collects the rest.
  uint64_t microseconds = nanoseconds / 1000;
  unsigned bucket = microseconds == 0 ? 0 : 64 - (unsigned)__builtin_clzll(microseconds);
  return bucket < CGCD_STALL_BUCKETS ? bucket : CGCD_STALL_BUCKETS - 1;
}

static inline void cgcd_stall_max(_Atomic(uint32_t) *max, uint64_t nanoseconds) {
  uint64_t microseconds = nanoseconds / 1000;
  uint32_t value = microseconds > UINT32_MAX ? UINT32_MAX : (uint32_t)microseconds;
  uint32_t current = atomic_load_explicit(max, memory_order_relaxed);
  while (value > current &&
         !atomic_compare_exchange_weak_explicit(max, &current, value, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void cgcd_stall_submitted(void *queue) {
  struct cgcd_stall_queue *row = cgcd_stall_queue_row(queue, cgcd_stall_milliseconds(cgcd_stall_now()));
  if (row != NULL) atomic_fetch_add_explicit(&row->submitted, 1, memory_order_relaxed);
}

void cgcd_stall_forget(void *queue) {
  uintptr_t key = (uintptr_t)queue;
  for (size_t index = 0; index < CGCD_STALL_QUEUES; index++) {
    struct cgcd_stall_queue *row = &cgcd_stall_queues[index];
    uintptr_t expected = key;
    if (atomic_load_explicit(&row->queue, memory_order_relaxed) == key &&
        atomic_compare_exchange_strong(&row->queue, &expected, 1)) {
      cgcd_stall_reset_row(row);
      atomic_store_explicit(&row->queue, 0, memory_order_release);
    }
  }
}

void cgcd_stall_clear(void) {
  for (size_t index = 0; index < CGCD_STALL_QUEUES; index++) {
    struct cgcd_stall_queue *row = &cgcd_stall_queues[index];
    uintptr_t expected = atomic_load_explicit(&row->queue, memory_order_relaxed);
    if (expected > 1 && atomic_compare_exchange_strong(&row->queue, &expected, 1)) {
      cgcd_stall_reset_row(row);
      atomic_store_explicit(&row->queue, 0, memory_order_release);
    }
  }
}

// MARK: - Begin and end

uint32_t cgcd_stall_begin(void *queue, uintptr_t site, uint64_t submitted) {
  struct cgcd_stall_thread *thread = cgcd_stall_thread_record();
  uint64_t now = cgcd_stall_now();
  uint32_t depth = atomic_load_explicit(&thread->depth, memory_order_relaxed);
  if (depth >= CGCD_STALL_DEPTH) {
    // Nested deeper than the record holds: counted in the depth only, not recorded or counted.
    atomic_store_explicit(&thread->depth, depth + 1, memory_order_relaxed);
    return depth;
  }
  struct cgcd_stall_queue *row = cgcd_stall_queue_row(queue, cgcd_stall_milliseconds(now));
  struct cgcd_stall_entry *entry = &thread->entries[depth];
  cgcd_stall_write_begin(thread);
  atomic_store_explicit(&entry->start, now, memory_order_relaxed);
  atomic_store_explicit(&entry->submitted, submitted, memory_order_relaxed);
  atomic_store_explicit(&entry->site, site, memory_order_relaxed);
  atomic_store_explicit(&entry->queue, (uintptr_t)queue, memory_order_relaxed);
  atomic_store_explicit(&entry->row, (uintptr_t)row, memory_order_relaxed);
  cgcd_stall_copy_label(entry->label, queue);
  atomic_store_explicit(&thread->depth, depth + 1, memory_order_relaxed);
  cgcd_stall_write_end(thread);
  if (row != NULL) {
    atomic_store_explicit(&row->last_used, cgcd_stall_milliseconds(now), memory_order_relaxed);
    atomic_fetch_add_explicit(&row->started, 1, memory_order_relaxed);
    if (submitted != 0 && submitted <= now) {
      uint64_t wait = now - submitted;
      atomic_fetch_add_explicit(&row->wait[cgcd_stall_bucket(wait)], 1, memory_order_relaxed);
      cgcd_stall_max(&row->wait_max, wait);
    }
  }
  return depth;
}

void cgcd_stall_end(uint32_t depth) {
  struct cgcd_stall_thread *thread = cgcd_stall_self;
  if (depth >= CGCD_STALL_DEPTH) {
    atomic_store_explicit(&thread->depth, depth, memory_order_relaxed);
    return;
  }
  uint64_t now = cgcd_stall_now();
  struct cgcd_stall_entry *entry = &thread->entries[depth];
  uint64_t start = atomic_load_explicit(&entry->start, memory_order_relaxed);
  uintptr_t queue = atomic_load_explicit(&entry->queue, memory_order_relaxed);
  struct cgcd_stall_queue *row = (struct cgcd_stall_queue *)atomic_load_explicit(&entry->row, memory_order_relaxed);
  cgcd_stall_write_begin(thread);
  atomic_store_explicit(&entry->ended_start, start, memory_order_relaxed);
  atomic_store_explicit(&entry->ended_at, now, memory_order_relaxed);
  atomic_store_explicit(&thread->depth, depth, memory_order_relaxed);
  cgcd_stall_write_end(thread);
  // The row may have been given to another queue meanwhile (evicted): then the end is not counted.
  if (row != NULL && atomic_load_explicit(&row->queue, memory_order_relaxed) == queue) {
    uint64_t run = now - start;
    atomic_fetch_add_explicit(&row->completed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&row->run[cgcd_stall_bucket(run)], 1, memory_order_relaxed);
    cgcd_stall_max(&row->run_max, run);
  }
}

// MARK: - The monitor's reads

size_t cgcd_stall_running(cgcd_stall_running_t *out, size_t capacity, uint64_t now, uint64_t at_least) {
  size_t count = 0;
  for (struct cgcd_stall_thread *thread = atomic_load_explicit(&cgcd_stall_threads, memory_order_acquire);
       thread != NULL && count < capacity; thread = thread->next) {
    if (!atomic_load_explicit(&thread->in_use, memory_order_acquire)) continue;
    for (int attempt = 0; attempt < 4; attempt++) {
      uint32_t before = atomic_load_explicit(&thread->sequence, memory_order_acquire);
      if (before & 1) continue;
      uint32_t depth = atomic_load_explicit(&thread->depth, memory_order_relaxed);
      if (depth == 0) break;
      uint32_t top = depth <= CGCD_STALL_DEPTH ? depth - 1 : CGCD_STALL_DEPTH - 1;
      struct cgcd_stall_entry *entry = &thread->entries[top];
      cgcd_stall_running_t item;
      item.record = thread;
      item.depth = top;
      item.tid = atomic_load_explicit(&thread->tid, memory_order_relaxed);
      item.start = atomic_load_explicit(&entry->start, memory_order_relaxed);
      item.site = atomic_load_explicit(&entry->site, memory_order_relaxed);
      cgcd_stall_read_label(entry->label, item.label);
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&thread->sequence, memory_order_relaxed) != before) continue;
      if (now > item.start && now - item.start >= at_least) out[count++] = item;
      break;
    }
  }
  return count;
}

int cgcd_stall_still_running(const void *record, uint32_t depth, uint64_t start, uint64_t *ended_at) {
  struct cgcd_stall_thread *mutable_thread = (struct cgcd_stall_thread *)record;
  if (depth >= CGCD_STALL_DEPTH) return 0;
  struct cgcd_stall_entry *entry = &mutable_thread->entries[depth];
  for (int attempt = 0; attempt < 1000; attempt++) {
    uint32_t before = atomic_load_explicit(&mutable_thread->sequence, memory_order_acquire);
    if (before & 1) continue;
    int running = atomic_load_explicit(&mutable_thread->in_use, memory_order_relaxed) &&
                  atomic_load_explicit(&mutable_thread->depth, memory_order_relaxed) > depth &&
                  atomic_load_explicit(&entry->start, memory_order_relaxed) == start;
    uint64_t ended_start = atomic_load_explicit(&entry->ended_start, memory_order_relaxed);
    uint64_t ended = atomic_load_explicit(&entry->ended_at, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&mutable_thread->sequence, memory_order_relaxed) != before) continue;
    *ended_at = ended_start == start ? ended : 0;
    return running;
  }
  *ended_at = 0;
  return 1;  // the owner is writing its record right now: still running, as far as can be told
}

size_t cgcd_stall_queue_rows(cgcd_stall_queue_row_t *out, size_t capacity) {
  size_t count = 0;
  for (size_t index = 0; index < CGCD_STALL_QUEUES && count < capacity; index++) {
    struct cgcd_stall_queue *row = &cgcd_stall_queues[index];
    uintptr_t key = atomic_load_explicit(&row->queue, memory_order_acquire);
    if (key <= 1) continue;
    cgcd_stall_queue_row_t *item = &out[count++];
    item->queue = key;
    cgcd_stall_read_label(row->label, item->label);
    item->submitted = atomic_load_explicit(&row->submitted, memory_order_relaxed);
    item->started = atomic_load_explicit(&row->started, memory_order_relaxed);
    item->completed = atomic_load_explicit(&row->completed, memory_order_relaxed);
    item->wait_max = (uint64_t)atomic_load_explicit(&row->wait_max, memory_order_relaxed) * 1000;
    item->run_max = (uint64_t)atomic_load_explicit(&row->run_max, memory_order_relaxed) * 1000;
    for (int bucket = 0; bucket < CGCD_STALL_BUCKETS; bucket++) {
      item->wait[bucket] = atomic_load_explicit(&row->wait[bucket], memory_order_relaxed);
      item->run[bucket] = atomic_load_explicit(&row->run[bucket], memory_order_relaxed);
    }
  }
  return count;
}

// MARK: - Pool probes

static _Atomic(uint64_t) cgcd_stall_probe_started[CGCD_STALL_PROBES];

static void cgcd_stall_probe_run(void *slot) {
  atomic_store_explicit(&cgcd_stall_probe_started[(uintptr_t)slot], cgcd_stall_now(), memory_order_release);
}

void cgcd_stall_probe(void *queue, uintptr_t slot) {
  atomic_store_explicit(&cgcd_stall_probe_started[slot], 0, memory_order_relaxed);
  cgcd_stall_dispatch_async_f(queue, (void *)slot, cgcd_stall_probe_run);
}

uint64_t cgcd_stall_probe_start(uintptr_t slot) {
  return atomic_load_explicit(&cgcd_stall_probe_started[slot], memory_order_acquire);
}

// MARK: - GCD_STALL_REPORT

// Defined in Swift (StallMonitor+Environment.swift); weak, so that a program linking this target
// alone still links.
extern void gcd_stall_report_from_environment(const char *value) __attribute__((weak));

// Runs when the program (or the library) is loaded: a process that never names the monitor gets
// its reports on standard error when the variable is set.
__attribute__((constructor)) static void cgcd_stall_environment(void) {
  const char *value = getenv("GCD_STALL_REPORT");
  if (value != NULL && value[0] != 0 && gcd_stall_report_from_environment != NULL) {
    gcd_stall_report_from_environment(value);
  }
}

// MARK: - Sites

#include <sys/uio.h>

size_t cgcd_stall_bytes_per_queue(void) { return sizeof(struct cgcd_stall_queue); }

size_t cgcd_stall_read_memory(uintptr_t address, void *out, size_t length) {
  struct iovec local = {.iov_base = out, .iov_len = length};
  struct iovec remote = {.iov_base = (void *)address, .iov_len = length};
  ssize_t copied = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  return copied < 0 ? 0 : (size_t)copied;
}

#include <dlfcn.h>

int cgcd_stall_symbol(uintptr_t address, const char **symbol, const char **file, uintptr_t *base) {
  Dl_info info;
  if (dladdr((void *)address, &info) == 0) return 0;
  *symbol = info.dli_sname;
  *file = info.dli_fname;
  *base = (uintptr_t)info.dli_fbase;
  return 1;
}

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

// The function symbol of the binary at `path` (its static symbol table, `.symtab`) that contains
// `offset` from the binary's load address, copied into `out`; 0 when none. For executables, which
// export none of their symbols to dladdr. Called only when a report is made, never on a queue.
int cgcd_stall_file_symbol(const char *path, uint64_t offset, char *out, size_t capacity) {
  int found = 0;
  int descriptor = open(path, O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) return 0;
  struct stat status;
  if (fstat(descriptor, &status) != 0 || (size_t)status.st_size < sizeof(Elf64_Ehdr)) {
    close(descriptor);
    return 0;
  }
  size_t size = (size_t)status.st_size;
  const unsigned char *file = mmap(NULL, size, PROT_READ, MAP_PRIVATE, descriptor, 0);
  close(descriptor);
  if (file == MAP_FAILED) return 0;
  const Elf64_Ehdr *header = (const Elf64_Ehdr *)file;
  if (memcmp(header->e_ident, ELFMAG, SELFMAG) == 0 && header->e_ident[EI_CLASS] == ELFCLASS64 &&
      header->e_shoff + (uint64_t)header->e_shnum * sizeof(Elf64_Shdr) <= size) {
    const Elf64_Shdr *sections = (const Elf64_Shdr *)(file + header->e_shoff);
    for (unsigned index = 0; index < header->e_shnum && !found; index++) {
      if (sections[index].sh_type != SHT_SYMTAB || sections[index].sh_link >= header->e_shnum) continue;
      const Elf64_Shdr *table = &sections[index];
      const Elf64_Shdr *names = &sections[table->sh_link];
      if (table->sh_offset + table->sh_size > size || names->sh_offset + names->sh_size > size) continue;
      const Elf64_Sym *symbols = (const Elf64_Sym *)(file + table->sh_offset);
      size_t count = table->sh_size / sizeof(Elf64_Sym);
      for (size_t symbol = 0; symbol < count; symbol++) {
        const Elf64_Sym *entry = &symbols[symbol];
        if (ELF64_ST_TYPE(entry->st_info) != STT_FUNC || entry->st_name >= names->sh_size) continue;
        if (offset < entry->st_value || offset >= entry->st_value + (entry->st_size ? entry->st_size : 1)) continue;
        const char *name = (const char *)(file + names->sh_offset + entry->st_name);
        size_t length = strnlen(name, names->sh_size - entry->st_name);
        if (length >= capacity) length = capacity - 1;
        memcpy(out, name, length);
        out[length] = 0;
        found = 1;
        break;
      }
    }
  }
  munmap((void *)file, size);
  return found;
}
