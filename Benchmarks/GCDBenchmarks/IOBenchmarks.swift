import Dispatch
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// I/O channels and dispatch data: a pipe copy through two stream channels
// (IOChannel, dispatch_io from C, the overlay's DispatchIO) against a plain
// read loop, and concatenation / region walks / copy-out of DispatchBuffer
// against dispatch_data from C and the overlay's DispatchData.

private let mebibyte = 1 << 20

func ioBenchmarks(_ c: CLibrary?) -> [Benchmark] {
  func pipeCopy(_ name: String, _ title: String, lowWater: Int) -> Benchmark {
    Benchmark(
      name: name, title: title, unit: "ns/MiB", count: 256, quickCount: 2, repeats: 5,
      runners: [
        .c: c.runner("io_pipe", input: [Double(lowWater)]), .gcd: .run { gcdPipeCopy($0, lowWater: lowWater) },
        .dispatch: .run { dispatchPipeCopy($0, lowWater: lowWater) },
      ])
  }
  return [
    pipeCopy(
      "io_pipe", "copy 256 MiB through a pipe, two stream channels, low water 1 (the package's default)",
      lowWater: 1),
    pipeCopy(
      "io_pipe_64k", "copy 256 MiB through a pipe, two stream channels, low water 64 KiB (one pipe buffer)",
      lowWater: 64 * 1024),
    pipeCopy(
      "io_pipe_1mib", "copy 256 MiB through a pipe, two stream channels, low water 1 MiB (libdispatch's default)",
      lowWater: mebibyte),
    Benchmark(
      name: "channel_read_ready",
      title: "a stream channel's 1-byte read of a byte already in its pipe: write(2), read(length: 1), its done",
      count: 5_000, quickCount: 2,
      runners: [
        .c: c.runner("channel_read_ready"), .gcd: .run(gcdChannelReadReady), .dispatch: .run(dispatchChannelReadReady),
      ]),
    Benchmark(
      name: "channel_upto_ready",
      title:
        "await read(upTo: 1) of a byte already in a stream channel's pipe: write(2), the read (C: write(2) and read(2); Dispatch: DispatchIO.read in a continuation)",
      count: 20_000, quickCount: 2,
      runners: [
        .c: c.runner("pipe_read_ready"), .gcd: .run(gcdChannelUpToReady), .dispatch: .run(dispatchChannelUpToReady),
      ]),
    Benchmark(
      name: "channel_write_ready",
      title:
        "await write(_:) of one byte into a stream channel's empty pipe, then read(2) of it (C: write(2) and read(2); Dispatch: DispatchIO.write in a continuation)",
      count: 20_000, quickCount: 2,
      runners: [
        .c: c.runner("pipe_read_ready"), .gcd: .run(gcdChannelWriteReady), .dispatch: .run(dispatchChannelWriteReady),
      ]),
    Benchmark(
      name: "channel_upto_wait",
      title:
        "await read(upTo: 1) that must wait: a byte to an echo thread's pipe, its echo read through a stream channel (C: a blocking read(2); Dispatch: DispatchIO.read in a continuation)",
      count: 5_000, quickCount: 2,
      runners: [.c: c.runner("pipe_echo"), .gcd: .run(gcdChannelUpToWait), .dispatch: .run(dispatchChannelUpToWait)]),
    Benchmark(
      name: "io_pipe_upto",
      title:
        "copy 256 MiB through a pipe: write(2) thread + await read(upTo: 65,536) loop (C: a 64 KiB read(2) loop; Dispatch: DispatchIO.read of 64 KiB in a continuation)",
      unit: "ns/MiB", count: 256, quickCount: 2, repeats: 3,
      runners: [.c: c.runner("read_loop"), .gcd: .run(gcdPipeUpTo), .dispatch: .run(dispatchPipeUpTo)]),
    Benchmark(
      name: "io_pipe_write",
      title:
        "copy 256 MiB through a pipe: an await write(_:) loop of 64 KiB + a read(2) thread (C: the read(2) loop and a write(2) thread; Dispatch: DispatchIO.write in a continuation)",
      unit: "ns/MiB", count: 256, quickCount: 2, repeats: 3,
      runners: [.c: c.runner("read_loop"), .gcd: .run(gcdPipeWrites), .dispatch: .run(dispatchPipeWrites)]),
    Benchmark(
      name: "io_read_loop", title: "copy 256 MiB through a pipe: write(2) thread + 64 KiB read(2) loop (reference)",
      unit: "ns/MiB", count: 256, quickCount: 2, repeats: 3,
      runners: [
        .c: c.runner("read_loop"), .gcd: .unavailable("n/a (the reference has no wrapper)"),
        .dispatch: .unavailable("n/a (the reference has no wrapper)"),
      ]),
    Benchmark(
      name: "data_concat", title: "concatenate 1,000 buffers of 64 bytes, then walk the 1,000 regions",
      count: 200, quickCount: 2, repeats: 5,
      runners: [.c: c.runner("data_concat"), .gcd: .run(gcdConcat), .dispatch: .run(dispatchConcat)]),
    Benchmark(
      name: "data_copy", title: "copy a 1,000-region buffer (64,000 bytes) out into contiguous memory",
      count: 20_000, quickCount: 2,
      runners: [.c: c.runner("data_copy"), .gcd: .run(gcdCopyOut), .dispatch: .run(dispatchCopyOut)]),
  ]
}

// MARK: - Pipe copy

private func makeBenchPipe() -> (Int32, Int32) {
  var ends: [Int32] = [0, 0]
  check(pipe(&ends) == 0, "pipe")
  return (ends[0], ends[1])
}

/// A stream channel over `descriptor` on a new queue labelled `label`; it closes the descriptor
/// when it closes.
private func closingStreamChannel(_ descriptor: Int32, label: String) -> IOChannel {
  IOChannel(fileDescriptor: descriptor, type: .stream, queue: Queue(label: label)) { close($0) }
}

private func chunkBytes() -> UnsafeMutableRawBufferPointer {
  let memory = UnsafeMutableRawBufferPointer(start: malloc(mebibyte), count: mebibyte)
  memory.initializeMemory(as: UInt8.self, repeating: 0x78)
  return memory
}

/// `count` one-byte reads, each of a byte written into the pipe before the read is issued.
@inline(never)
func gcdChannelReadReady(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = Queue(label: "bench.io.ready")
  let done = DispatchSemaphore(value: 0)
  let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue) { close($0) }
  var byte: UInt8 = 1
  let start = monotonicNanos()
  for _ in 0..<count {
    check(write(writeEnd, &byte, 1) == 1, "write")
    channel.read(length: 1, queue: queue) { finished, _, _ in
      if finished { done.signal() }
    }
    done.wait()
  }
  let end = monotonicNanos()
  channel.close()
  close(writeEnd)
  return Sample(start: start, end: end, count: count)
}

/// A `DispatchIO` read of `length` bytes awaited as a user bridges it: a continuation resumed by
/// the read's end with the bytes it delivered.
private func dispatchRead(_ channel: DispatchIO, length: Int, queue: DispatchQueue) async -> Int {
  await withCheckedContinuation { continuation in
    let total = Mutex(0)
    channel.read(offset: 0, length: length, queue: queue) { finished, data, _ in
      let sum = total.withLock { total in
        total += data?.count ?? 0
        return total
      }
      if finished { continuation.resume(returning: sum) }
    }
  }
}

/// `count` times: a byte written into `writeEnd` with write(2), then a one-byte `read` awaited (of
/// that byte, already in the pipe, or of its echo, which another thread writes). Closes `writeEnd`.
private func timedWriteThenRead(_ count: Int, _ writeEnd: Int32, _ read: @escaping @Sendable () async -> Int) -> Sample
{
  let sample = timed(count) {
    var byte: UInt8 = 1
    for _ in 0..<count {
      check(write(writeEnd, &byte, 1) == 1, "write")
      check(await read() == 1, "a one-byte read")
    }
  }
  close(writeEnd)
  return sample
}

@inline(never)
func gcdChannelUpToReady(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let channel = closingStreamChannel(readEnd, label: "bench.io.upto")
  defer { channel.close() }
  return timedWriteThenRead(count, writeEnd) { (try? await channel.read(upTo: 1))?.count ?? 0 }
}

/// The same with `DispatchIO`, as a user bridges it: a continuation resumed by the read's end.
@inline(never)
func dispatchChannelUpToReady(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = DispatchQueue(label: "bench.io.upto")
  let channel = DispatchIO(type: .stream, fileDescriptor: readEnd, queue: queue) { _ in close(readEnd) }
  defer { channel.close() }
  return timedWriteThenRead(count, writeEnd) {
    await dispatchRead(channel, length: 1, queue: queue)
  }
}

/// `count` awaited one-byte writes into a pipe, each read back with read(2) after it returned.
private func timedWrites(_ count: Int, _ readEnd: Int32, _ write: @escaping @Sendable () async -> Bool) -> Sample {
  let sample = timed(count) {
    var byte: UInt8 = 0
    for _ in 0..<count {
      check(await write(), "a one-byte write")
      check(read(readEnd, &byte, 1) == 1, "read")
    }
  }
  close(readEnd)
  return sample
}

@inline(never)
func gcdChannelWriteReady(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let channel = closingStreamChannel(writeEnd, label: "bench.io.write")
  defer { channel.close() }
  let byte = DispatchBuffer([1])
  return timedWrites(count, readEnd) { (try? await channel.write(byte)) != nil }
}

@inline(never)
func dispatchChannelWriteReady(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = DispatchQueue(label: "bench.io.write")
  let channel = DispatchIO(type: .stream, fileDescriptor: writeEnd, queue: queue) { _ in close(writeEnd) }
  defer { channel.close() }
  return timedWrites(count, readEnd) {
    await withCheckedContinuation { continuation in
      let byte = [UInt8(1)].withUnsafeBytes { DispatchData(bytes: $0) }
      channel.write(offset: 0, data: byte, queue: queue) { finished, _, error in
        if finished { continuation.resume(returning: error == 0) }
      }
    }
  }
}

/// An echo thread's two pipes: what is written into `toEcho` comes back from `echoed` (made by
/// a queue's thread, which ends when `toEcho` is closed).
private func makeEcho() -> (toEcho: Int32, echoed: Int32) {
  let (fromBench, toEcho) = makeBenchPipe()
  let (echoed, fromEcho) = makeBenchPipe()
  Queue(label: "bench.io.echo").async {
    var byte: UInt8 = 0
    while Glibc.read(fromBench, &byte, 1) == 1 { check(write(fromEcho, &byte, 1) == 1, "echo") }
    close(fromBench)
    close(fromEcho)
  }
  return (toEcho, echoed)
}

@inline(never)
func gcdChannelUpToWait(_ count: Int) -> Sample {
  let (toEcho, echoed) = makeEcho()
  let channel = closingStreamChannel(echoed, label: "bench.io.wait")
  defer { channel.close() }
  return timedWriteThenRead(count, toEcho) { (try? await channel.read(upTo: 1))?.count ?? 0 }
}

@inline(never)
func dispatchChannelUpToWait(_ count: Int) -> Sample {
  let (toEcho, echoed) = makeEcho()
  let queue = DispatchQueue(label: "bench.io.wait")
  let channel = DispatchIO(type: .stream, fileDescriptor: echoed, queue: queue) { _ in close(echoed) }
  defer { channel.close() }
  return timedWriteThenRead(count, toEcho) { await dispatchRead(channel, length: 1, queue: queue) }
}

/// A queue's thread reads `readEnd` with 64 KiB read(2) calls until the end; `write` is called
/// `count` × 16 times (64 KiB each), timed until the last returns (the pipe holds the rest); then
/// `close` ends the writer and the reader must have got every byte. ns per MiB.
private func timedPipeWrites(
  _ count: Int, _ readEnd: Int32, close closeWriter: () -> Void, _ write: @escaping @Sendable () async -> Bool
) -> Sample {
  let drained = Mutex(0)
  let done = DispatchSemaphore(value: 0)
  Queue(label: "bench.io.reader").async {
    let buffer = UnsafeMutableRawPointer.allocate(byteCount: 1 << 16, alignment: 16)
    var total = 0
    while true {
      let got = read(readEnd, buffer, 1 << 16)
      if got <= 0 { break }
      total += got
    }
    buffer.deallocate()
    drained.withLock { $0 = total }
    done.signal()
  }
  let sample = timed(count) {
    for _ in 0..<(count * 16) { check(await write(), "a 64 KiB write") }
  }
  closeWriter()
  done.wait()
  close(readEnd)
  check(drained.withLock { $0 } == count * mebibyte, "pipe writes: bytes read")
  return sample
}

@inline(never)
func gcdPipeWrites(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let channel = closingStreamChannel(writeEnd, label: "bench.io.w")
  let chunk = DispatchBuffer([UInt8](repeating: 0x78, count: 1 << 16))
  return timedPipeWrites(count, readEnd, close: { channel.close() }) { (try? await channel.write(chunk)) != nil }
}

@inline(never)
func dispatchPipeWrites(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = DispatchQueue(label: "bench.io.w")
  let channel = DispatchIO(type: .stream, fileDescriptor: writeEnd, queue: queue) { _ in close(writeEnd) }
  return timedPipeWrites(count, readEnd, close: { channel.close() }) {
    await withCheckedContinuation { continuation in
      let chunk = [UInt8](repeating: 0x78, count: 1 << 16).withUnsafeBytes { DispatchData(bytes: $0) }
      channel.write(offset: 0, data: chunk, queue: queue) { finished, _, error in
        if finished { continuation.resume(returning: error == 0) }
      }
    }
  }
}

/// A queue's thread writes `count` MiB into `writeEnd` with write(2) (64 KiB at a time) and
/// closes it; `read` is called until it returns 0 (the end), timed. ns per MiB.
private func timedPipeReads(_ count: Int, _ writeEnd: Int32, _ read: @escaping @Sendable () async -> Int) -> Sample {
  let writing = Queue(label: "bench.io.writer")
  let received = Mutex(0)
  let sample = timed(count) {
    writing.async {
      let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 1 << 16, alignment: 16)
      chunk.initializeMemory(as: UInt8.self, repeating: 0x78)
      for _ in 0..<(count * 16) {
        var offset = 0
        while offset < chunk.count {
          let wrote = write(writeEnd, chunk.baseAddress! + offset, chunk.count - offset)
          check(wrote > 0, "write")
          offset += wrote
        }
      }
      close(writeEnd)
      chunk.deallocate()
    }
    var total = 0
    while true {
      let got = await read()
      if got == 0 { break }
      total += got
    }
    received.withLock { $0 = total }
  }
  check(received.withLock { $0 } == count * mebibyte, "pipe reads: bytes received")
  return sample
}

@inline(never)
func gcdPipeUpTo(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let channel = closingStreamChannel(readEnd, label: "bench.io.upto")
  defer { channel.close() }
  return timedPipeReads(count, writeEnd) { (try? await channel.read(upTo: 1 << 16))?.count ?? 0 }
}

@inline(never)
func dispatchPipeUpTo(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = DispatchQueue(label: "bench.io.upto")
  let channel = DispatchIO(type: .stream, fileDescriptor: readEnd, queue: queue) { _ in close(readEnd) }
  channel.setLimit(lowWater: 1)
  defer { channel.close() }
  return timedPipeReads(count, writeEnd) {
    await dispatchRead(channel, length: 1 << 16, queue: queue)
  }
}

@inline(never)
func dispatchChannelReadReady(_ count: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = DispatchQueue(label: "bench.io.ready")
  let done = DispatchSemaphore(value: 0)
  let channel = DispatchIO(type: .stream, fileDescriptor: readEnd, queue: queue) { _ in close(readEnd) }
  var byte: UInt8 = 1
  let start = monotonicNanos()
  for _ in 0..<count {
    check(write(writeEnd, &byte, 1) == 1, "write")
    channel.read(offset: 0, length: 1, queue: queue) { finished, _, _ in
      if finished { done.signal() }
    }
    done.wait()
  }
  let end = monotonicNanos()
  channel.close()
  close(writeEnd)
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func gcdPipeCopy(_ count: Int, lowWater: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = Queue(label: "bench.io")
  let done = try! Semaphore(value: 0)
  let cleaned = try! Semaphore(value: 0)
  let reader = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue) {
    close($0)
    _ = cleaned.signal()
  }
  let writer = IOChannel(fileDescriptor: writeEnd, type: .stream, queue: queue) {
    close($0)
    _ = cleaned.signal()
  }
  reader.setLimit(lowWater: lowWater)
  let chunk = DispatchBuffer(bytesNoCopy: UnsafeRawBufferPointer(chunkBytes()), deallocator: .free)
  let received = Counter()
  let start = monotonicNanos()
  reader.read(length: .max, queue: queue) { finished, data, _ in
    if let data { received.value += data.count }
    if finished { _ = done.signal() }
  }
  for _ in 0..<count {
    writer.write(data: chunk, queue: queue) { _, _, _ in }
  }
  writer.close()
  done.wait()
  let end = monotonicNanos()
  check(received.value == count * mebibyte, "GCD io_pipe: bytes received")
  reader.close()
  cleaned.wait()
  cleaned.wait()
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchPipeCopy(_ count: Int, lowWater: Int) -> Sample {
  let (readEnd, writeEnd) = makeBenchPipe()
  let queue = DispatchQueue(label: "bench.io")
  let done = DispatchSemaphore(value: 0)
  let cleaned = DispatchSemaphore(value: 0)
  let reader = DispatchIO(type: .stream, fileDescriptor: readEnd, queue: queue) { _ in
    close(readEnd)
    cleaned.signal()
  }
  let writer = DispatchIO(type: .stream, fileDescriptor: writeEnd, queue: queue) { _ in
    close(writeEnd)
    cleaned.signal()
  }
  reader.setLimit(lowWater: lowWater)
  // A copy (made before timing): the overlay's `bytesNoCopy` with `.free` crashes on
  // Linux (it re-wraps libdispatch's FREE destructor marker as a new block).
  let bytes = chunkBytes()
  defer { free(bytes.baseAddress) }
  let chunk = DispatchData(bytes: UnsafeRawBufferPointer(bytes))
  let received = Counter()
  let start = monotonicNanos()
  reader.read(offset: 0, length: .max, queue: queue) { finished, data, _ in
    if let data { received.value += data.count }
    if finished { done.signal() }
  }
  for _ in 0..<count {
    writer.write(offset: 0, data: chunk, queue: queue) { _, _, _ in }
  }
  writer.close()
  done.wait()
  let end = monotonicNanos()
  check(received.value == count * mebibyte, "Dispatch io_pipe: bytes received")
  reader.close()
  cleaned.wait()
  cleaned.wait()
  return Sample(start: start, end: end, count: count)
}

// MARK: - Data

private let partCount = 1000
private let partBytes = [UInt8](repeating: 0x41, count: 64)

@inline(never)
func gcdConcat(_ count: Int) -> Sample {
  let parts = (0..<partCount).map { _ in DispatchBuffer(partBytes) }
  var total = 0
  let start = monotonicNanos()
  for _ in 0..<count {
    var all = DispatchBuffer()
    for part in parts { all.append(part) }
    all.enumerateRegions { bytes, _ in
      total += bytes.count
      return true
    }
  }
  let end = monotonicNanos()
  check(total == count * partCount * 64, "GCD data_concat: bytes walked")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchConcat(_ count: Int) -> Sample {
  let parts = (0..<partCount).map { _ in partBytes.withUnsafeBytes { DispatchData(bytes: $0) } }
  var total = 0
  let start = monotonicNanos()
  for _ in 0..<count {
    var all = DispatchData.empty
    for part in parts { all.append(part) }
    all.enumerateBytes { bytes, _, _ in total += bytes.count }
  }
  let end = monotonicNanos()
  check(total == count * partCount * 64, "Dispatch data_concat: bytes walked")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func gcdCopyOut(_ count: Int) -> Sample {
  var all = DispatchBuffer()
  for _ in 0..<partCount { all.append(DispatchBuffer(partBytes)) }
  let target = UnsafeMutableRawBufferPointer.allocate(byteCount: partCount * 64, alignment: 16)
  defer { target.deallocate() }
  var copied = 0
  let start = monotonicNanos()
  for _ in 0..<count { copied += all.copyBytes(to: target) }
  let end = monotonicNanos()
  check(copied == count * partCount * 64, "GCD data_copy: bytes copied")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchCopyOut(_ count: Int) -> Sample {
  var all = DispatchData.empty
  for _ in 0..<partCount { partBytes.withUnsafeBytes { all.append(DispatchData(bytes: $0)) } }
  let target = UnsafeMutableRawBufferPointer.allocate(byteCount: partCount * 64, alignment: 16)
  defer { target.deallocate() }
  var copied = 0
  let start = monotonicNanos()
  for _ in 0..<count {
    all.copyBytes(to: target, count: partCount * 64)
    copied += partCount * 64
  }
  let end = monotonicNanos()
  check(copied == count * partCount * 64, "Dispatch data_copy: bytes copied")
  return Sample(start: start, end: end, count: count)
}
