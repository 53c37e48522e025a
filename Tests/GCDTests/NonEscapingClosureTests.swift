import GCD
import Synchronization
import Testing

/// The calling convention the package relies on to run a non-escaping
/// closure through `dispatch_sync_f` / `dispatch_apply_f` without
/// allocating (Internals/NonEscapingClosure.swift, CGCD.c). Each entry
/// point — `cgcd_sync`, `cgcd_sync_here`, `cgcd_apply` — runs closures that
/// capture, return, throw and nest, in a child process: if the compiler
/// ever passes closures differently, this suite fails (with the child's
/// crash or wrong value) instead of taking the test run down.
@Suite("Non-escaping closures through C")
struct NonEscapingClosureTests {
  @Test("sync, syncBarrier and apply pass captures, results and errors through the C trampolines intact")
  func callingConvention() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      exerciseNonEscapingClosures()
    }
    expectChildSaidOK(result)
  }
}

struct Wide: Equatable {
  var a: Int
  var b: String
  var c: (Double, UInt8)

  static func == (lhs: Wide, rhs: Wide) -> Bool { lhs.a == rhs.a && lhs.b == rhs.b && lhs.c == rhs.c }
}

struct Thrown: Error, Equatable { let code: Int }

/// Every entry point with closures of every shape; ends the child with "ok" or what differed.
func exerciseNonEscapingClosures() {
  let serial = Queue(label: "convention.serial")
  let concurrent = Queue(label: "convention.concurrent", kind: .concurrent)
  let targeted = Queue(label: "convention.targeted", target: serial)
  let words = ["alpha", "beta", "gamma"]
  let box = Counter()
  let seed = Int.random(in: 1...1_000)

  for queue in [serial, concurrent, targeted] {
    let name = queue.label
    // cgcd_sync_here (from outside every queue; the targeted queue goes through cgcd_sync).
    let wide = queue.sync { Wide(a: seed * 3, b: words.joined(separator: "-"), c: (Double(seed) / 2, 7)) }
    childCheck(
      wide == Wide(a: seed * 3, b: "alpha-beta-gamma", c: (Double(seed) / 2, 7)), "\(name): sync result \(wide)")
    var mutated = seed
    queue.sync { mutated += words.count }
    childCheck(mutated == seed + 3, "\(name): a captured variable changed to \(mutated)")
    do {
      try queue.sync { () throws(Thrown) in throw Thrown(code: seed) }
      childCheck(false, "\(name): sync did not rethrow")
    } catch {
      childCheck(error == Thrown(code: seed), "\(name): rethrew \(error)")
    }
    let barrier = queue.syncBarrier { words[seed % 3] + "\(seed)" }
    childCheck(barrier == words[seed % 3] + "\(seed)", "\(name): syncBarrier returned \(barrier)")
    // cgcd_sync (nested: a frame is running) and a thrown error through two levels.
    let other = Queue(label: "convention.other")
    let nested = queue.sync { other.sync { queue.isCurrent && other.isCurrent ? seed + 1 : -1 } }
    childCheck(nested == seed + 1, "\(name): nested sync returned \(nested)")
    // cgcd_apply: every index once, the captured counter and array intact.
    let sum = Atomic<Int>(0)
    queue.apply(100) { index in
      sum.add(index + words[index % 3].count, ordering: .relaxed)
      box.increment()
    }
    let letters = (0..<100).reduce(0) { $0 + $1 + words[$1 % 3].count }
    childCheck(sum.load(ordering: .relaxed) == letters, "\(name): apply summed \(sum.load(ordering: .relaxed))")
  }
  childCheck(box.current == 300, "apply ran \(box.current) iterations, not 300")
  endChild("ok")
}
