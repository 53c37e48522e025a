import Glibc

/// Polls `condition` until it holds or `timeout` passes; true if it held.
@available(*, noasync, message: "blocks the thread")
func pollUntil(timeout: Duration = generousTimeout, _ condition: () -> Bool) -> Bool {
  let deadline = ContinuousClock.now + timeout
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    usleep(2_000)
  }
  return true
}

/// For something that must NOT happen: true if it happened within the brief timeout.
@available(*, noasync, message: "blocks the thread")
func pollBriefly(_ condition: () -> Bool) -> Bool { pollUntil(timeout: briefTimeout, condition) }

/// The number of open descriptors of this process.
func openDescriptorCount() -> Int { openDescriptorTargets().count }

/// Every open descriptor of this process and what it refers to.
func openDescriptorTargets() -> [Int32: String] {
  guard let directory = opendir("/proc/self/fd") else { return [:] }
  defer { closedir(directory) }
  let own = dirfd(directory)
  var result: [Int32: String] = [:]
  while let entry = readdir(directory) {
    let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    guard let descriptor = Int32(name), descriptor != own else { continue }
    var buffer = [CChar](repeating: 0, count: 4096)
    let count = readlink("/proc/self/fd/\(name)", &buffer, buffer.count - 1)
    result[descriptor] =
      count >= 0 ? String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : "?"
  }
  return result
}
