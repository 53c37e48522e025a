import CGCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Stall watching's C boundary (the records live in CGCD's Stall.c). Off, every submission or run
// of the package's work pays one relaxed load of `cgcd_stall_watching` and a branch; on, the
// watched path records the work on its thread (`cgcd_stall_begin` / `cgcd_stall_end`).

/// Whether a `StallMonitor` watches.
@inlinable
var stallWatching: Bool { cgcd_stall_is_watching() != 0 }

/// `withFrame`'s watched path: the work is recorded on this thread for the monitor, with `site`
/// (the address of the code the user gave, 0 when none) and when it was submitted (0: unknown).
@usableFromInline
@inline(never)
func withWatchedFrame(queue: OpaquePointer, flags: UInt, site: UInt, submitted: UInt64, _ body: () -> Void) {
  let depth = cgcd_stall_begin(UnsafeMutableRawPointer(queue), site, submitted)
  withUnwatchedFrame(queue: queue, flags: flags, body)
  cgcd_stall_end(depth)
}

/// The address of a closure's code: the site a report names. The closure goes to C as Swift
/// passes any closure argument, two words (NonEscapingClosure.swift), and C returns the first: a
/// cast through a generic function would give the address of a reabstraction thunk instead.
@usableFromInline
@_silgen_name("cgcd_stall_site")
func stallSite(_ body: () -> Void) -> UInt

/// CLOCK_MONOTONIC in nanoseconds.
@usableFromInline
var stallNow: UInt64 { cgcd_stall_now() }

/// Counts a submission to `queue` for its statistics.
@usableFromInline
func stallSubmitted(_ queue: OpaquePointer) { cgcd_stall_submitted(UnsafeMutableRawPointer(queue)) }

/// Turns the watched paths on or off.
func stallSetWatching(_ on: Bool) { cgcd_stall_set_watching(on ? 1 : 0) }

/// A queue's statistics row is cleared before its queue is freed, and when a queue is made (at
/// the address of a freed one, perhaps): a row never outlives its queue into another's.
@usableFromInline
func stallForget(_ queue: OpaquePointer) { cgcd_stall_forget(UnsafeMutableRawPointer(queue)) }

/// Clears every statistics row.
func stallClear() { cgcd_stall_clear() }

/// A piece of work that runs, as the monitor reads it from its thread's record.
struct StallRunning: Hashable {
  let record: UInt
  let depth: UInt32
  let threadID: Int32
  let start: UInt64
  let site: UInt
  let label: String
}

/// The innermost watched work of every thread that has run for at least `atLeast` nanoseconds.
func stallRunning(now: UInt64, atLeast: UInt64) -> [StallRunning] {
  let capacity = 256
  let items = UnsafeMutablePointer<cgcd_stall_running_t>.allocate(capacity: capacity)
  defer { items.deallocate() }
  let count = cgcd_stall_running(items, capacity, now, atLeast)
  return (0..<count).map { index in
    let item = items[index]
    return StallRunning(
      record: UInt(bitPattern: item.record), depth: item.depth, threadID: item.tid, start: item.start,
      site: item.site, label: stallLabel(item.label))
  }
}

/// Whether `work` still runs; if not, when it ended (nil when unknown).
func stallStillRunning(_ work: StallRunning) -> (running: Bool, endedAt: UInt64?) {
  var ended: UInt64 = 0
  let running =
    cgcd_stall_still_running(UnsafeRawPointer(bitPattern: work.record)!, work.depth, work.start, &ended) != 0
  return (running, ended == 0 ? nil : ended)
}

/// The 48 characters of a label in a C record.
private typealias CLabel = (
  CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar,
  CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar,
  CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar, CChar
)

/// The label words of a record as a String.
private func stallLabel(_ tuple: CLabel) -> String {
  withUnsafeBytes(of: tuple) { bytes in
    let characters = bytes.prefix { $0 != 0 }
    return String(decoding: characters, as: UTF8.self)
  }
}

/// One queue's counts and histograms (buckets: under 1 µs, then [2^(k-1), 2^k) µs).
struct StallQueueRow {
  let queue: UInt
  let label: String
  let submitted: UInt64
  let started: UInt64
  let completed: UInt64
  let waitMax: UInt64
  let runMax: UInt64
  let wait: [UInt32]
  let run: [UInt32]
}

/// The statistics rows of every queue watched work ran on.
func stallQueueRows() -> [StallQueueRow] {
  let capacity = 512
  let rows = UnsafeMutablePointer<cgcd_stall_queue_row_t>.allocate(capacity: capacity)
  defer { rows.deallocate() }
  let count = cgcd_stall_queue_rows(rows, capacity)
  return (0..<count).map { index in
    var row = rows[index]
    let wait = withUnsafeBytes(of: &row.wait) { Array($0.bindMemory(to: UInt32.self)) }
    let run = withUnsafeBytes(of: &row.run) { Array($0.bindMemory(to: UInt32.self)) }
    return StallQueueRow(
      queue: row.queue, label: stallLabel(row.label), submitted: row.submitted, started: row.started,
      completed: row.completed, waitMax: row.wait_max, runMax: row.run_max, wait: wait, run: run)
  }
}

/// Histogram buckets per row.
let stallBuckets = Int(CGCD_STALL_BUCKETS)

/// Submits the pool probe of `slot` to the global queue `queue`.
func stallProbe(_ queue: OpaquePointer, slot: Int) { cgcd_stall_probe(UnsafeMutableRawPointer(queue), UInt(slot)) }

/// When the probe of `slot` started (nil: not yet).
func stallProbeStart(slot: Int) -> UInt64? {
  let start = cgcd_stall_probe_start(UInt(slot))
  return start == 0 ? nil : start
}

/// Symbols already looked up (a report's site repeats at each doubling; the executable's symbol
/// table is scanned once per address).
private let stallSymbols = Mutex<[UInt: String?]>([:])

/// The symbol of the code at `address` (demangled), or the binary and offset; nil for 0.
func stallSymbol(_ address: UInt) -> String? {
  if let known = stallSymbols.withLock({ $0[address] }) { return known }
  let found = stallLookUpSymbol(address)
  stallSymbols.withLock { symbols in
    if symbols.count >= 4096 { symbols.removeAll() }
    symbols[address] = found
  }
  return found
}

private func stallLookUpSymbol(_ address: UInt) -> String? {
  guard address != 0 else { return nil }
  var symbol: UnsafePointer<CChar>?
  var file: UnsafePointer<CChar>?
  var base: UInt = 0
  guard cgcd_stall_symbol(address, &symbol, &file, &base) != 0 else { return nil }
  if let symbol {
    let mangled = String(cString: symbol)
    return stallDemangle(mangled) ?? mangled
  }
  if let file {
    let path = String(cString: file)
    var name = [CChar](repeating: 0, count: 1024)
    if cgcd_stall_file_symbol(file, UInt64(address &- base), &name, name.count) != 0 {
      let mangled = name.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
      return stallDemangle(mangled) ?? mangled
    }
    let binary = path.split(separator: "/").last.map(String.init) ?? path
    return "\(binary)+0x\(String(address &- base, radix: 16))"
  }
  return nil
}

@_silgen_name("swift_demangle")
private func swift_demangle(
  _ mangledName: UnsafePointer<CChar>?, _ mangledNameLength: Int, _ outputBuffer: UnsafeMutablePointer<CChar>?,
  _ outputBufferSize: UnsafeMutablePointer<Int>?, _ flags: UInt32
) -> UnsafeMutablePointer<CChar>?

private func stallDemangle(_ mangled: String) -> String? {
  mangled.withCString { name in
    guard let result = swift_demangle(name, strlen(name), nil, nil, 0) else { return nil }
    defer { free(result) }
    return String(cString: result)
  }
}

/// What the kernel says thread `threadID` of this process is doing: its state letter and name
/// (`/proc/self/task/TID/stat`), `wchan`, and the system call it is in (`syscall`).
func stallKernelState(threadID: Int32) -> String {
  let base = "/proc/self/task/\(threadID)/"
  var parts: [String] = []
  if let stat = stallReadSmallFile(base + "stat"), let close = stat.lastIndex(of: ")") {
    let rest = stat[stat.index(after: close)...].split(separator: " ")
    if let state = rest.first { parts.append("state \(state)") }
  }
  if let wchan = stallReadSmallFile(base + "wchan"), !wchan.isEmpty, wchan != "0" {
    parts.append("wchan \(wchan)")
  }
  if let syscall = stallReadSmallFile(base + "syscall") {
    let fields = syscall.split(separator: " ")
    if let number = fields.first {
      parts.append(number == "running" ? "running" : "syscall \(number)\(stallSyscallName(number))")
    }
  }
  return parts.isEmpty ? "kernel state unavailable" : parts.joined(separator: ", ")
}

/// The names of the system calls blocked work is most often found in (x86-64 and arm64 numbers).
private func stallSyscallName(_ number: Substring) -> String {
  #if arch(x86_64)
    let names: [Substring: String] = [
      "0": "read", "1": "write", "7": "poll", "23": "select", "35": "nanosleep", "202": "futex",
      "232": "epoll_wait", "61": "wait4", "43": "accept", "288": "accept4", "45": "recvfrom",
      "230": "clock_nanosleep", "270": "pselect6", "271": "ppoll", "281": "epoll_pwait",
    ]
  #else
    let names: [Substring: String] = [
      "63": "read", "64": "write", "101": "nanosleep", "98": "futex", "22": "epoll_pwait",
      "260": "wait4", "202": "accept", "242": "accept4", "207": "recvfrom", "115": "clock_nanosleep",
      "72": "pselect6", "73": "ppoll",
    ]
  #endif
  return names[number].map { " (\($0))" } ?? ""
}

/// A small `/proc` file's text without its trailing newline, spaces or NULs; nil when unreadable.
private func stallReadSmallFile(_ path: String) -> String? {
  guard case .success(let text) = system_readSmallFile(path) else { return nil }
  var trimmed = Substring(text)
  while let last = trimmed.last, last == "\n" || last == " " || last == "\0" { trimmed.removeLast() }
  return String(trimmed)
}

/// The return addresses found on the stack of thread `threadID`, symbolicated, innermost first:
/// where the thread is in its system call (`/proc/self/task/TID/syscall` gives its stack pointer
/// and program counter), then each word of the 32 KiB above the stack pointer that points into
/// executable code just after a call instruction. The stack is read with `process_vm_readv`, which
/// fails instead of faulting if the thread has moved on or ended; the thread itself is not
/// stopped or signalled. A scan, not an unwind: a stale return address of an earlier call can
/// appear. nil when the thread is running (not in a system call) or on another architecture.
func stallStack(threadID: Int32, limit: Int = 16) -> [String]? {
  #if arch(x86_64)
    guard let syscall = stallReadSmallFile("/proc/self/task/\(threadID)/syscall") else { return nil }
    let fields = syscall.split(separator: " ")
    guard fields.count >= 3, fields[0] != "running",
      let stackPointer = UInt(fields[fields.count - 2].dropFirst(2), radix: 16),
      let programCounter = UInt(fields[fields.count - 1].dropFirst(2), radix: 16)
    else { return nil }
    let code = stallExecutableRanges()
    func isCode(_ address: UInt) -> Bool { code.contains { $0.contains(address) } }
    var frames: [UInt] = [programCounter]
    let length = 32 * 1024
    var words = [UInt](repeating: 0, count: length / MemoryLayout<UInt>.size)
    let copied = words.withUnsafeMutableBytes { cgcd_stall_read_memory(stackPointer, $0.baseAddress!, length) }
    for word in words.prefix(copied / MemoryLayout<UInt>.size) where frames.count < limit {
      if isCode(word) && stallFollowsCall(word) { frames.append(word) }
    }
    return frames.map { stallSymbol($0) ?? "0x\(String($0, radix: 16))" }
  #else
    return nil
  #endif
}

/// Whether the bytes before `address` end with an x86-64 call instruction (`call rel32`, or an
/// indirect call through a register or memory), as they do before a return address.
private func stallFollowsCall(_ address: UInt) -> Bool {
  var bytes = [UInt8](repeating: 0, count: 7)
  guard address > 7, bytes.withUnsafeMutableBytes({ cgcd_stall_read_memory(address - 7, $0.baseAddress!, 7) }) == 7
  else { return false }
  // bytes[k] is at address - 7 + k.
  if bytes[2] == 0xE8 { return true }  // call rel32
  if bytes[1] == 0xFF && (bytes[2] == 0x15 || bytes[2] & 0xF8 == 0x90) { return true }  // call [rip+d32], [r+d32]
  if bytes[0] == 0x41 && bytes[1] == 0xFF && bytes[2] & 0xF8 == 0x90 { return true }  // call [r8-15+d32]
  if bytes[4] == 0xFF && bytes[5] & 0xF8 == 0x50 { return true }  // call [r+d8]
  if bytes[3] == 0x41 && bytes[4] == 0xFF && bytes[5] & 0xF8 == 0x50 { return true }  // call [r8-15+d8]
  if bytes[5] == 0xFF && bytes[6] & 0xF8 == 0xD0 { return true }  // call reg
  if bytes[4] == 0x41 && bytes[5] == 0xFF && bytes[6] & 0xF8 == 0xD0 { return true }  // call r8-15
  // call [reg]
  if bytes[5] == 0xFF && bytes[6] & 0xF8 == 0x10 && bytes[6] & 0x07 != 4 && bytes[6] & 0x07 != 5 { return true }
  return false
}

/// The executable mappings of this process (`/proc/self/maps`).
private func stallExecutableRanges() -> [ClosedRange<UInt>] {
  guard let maps = stallReadSmallFile("/proc/self/maps") else { return [] }
  var ranges: [ClosedRange<UInt>] = []
  for line in maps.split(separator: "\n") {
    let fields = line.split(separator: " ", maxSplits: 2)
    guard fields.count >= 2, fields[1].count >= 3, fields[1][fields[1].index(fields[1].startIndex, offsetBy: 2)] == "x"
    else { continue }
    let bounds = fields[0].split(separator: "-")
    guard bounds.count == 2, let low = UInt(bounds[0], radix: 16), let high = UInt(bounds[1], radix: 16), high > low
    else { continue }
    ranges.append(low...(high - 1))
  }
  return ranges
}

/// The bytes of one watched queue's statistics row.
var stallBytesPerQueue: Int { cgcd_stall_bytes_per_queue() }

/// Sleeps the calling thread (the monitor's own, never a queue's) for `nanoseconds`.
func stallSleep(nanoseconds: UInt64) {
  var request = timespec(tv_sec: Int(nanoseconds / 1_000_000_000), tv_nsec: Int(nanoseconds % 1_000_000_000))
  var remaining = timespec()
  while nanosleep(&request, &remaining) == -1 && errno == EINTR { request = remaining }
}
