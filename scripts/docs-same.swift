// Fails unless two builds of the DocC site hold the same files with the same content.
//
//   swift scripts/docs-same.swift <first site> <second site>
//
// `make docs-twice` builds the site on the tree as it is, then again on the warm tree, and compares
// the two: a second build that lost the symbol pages (as the old `make docs` did, "No symbol matched
// 'GCD'") or any of their content shows here. DocC writes JSON objects with their keys in a different
// order on each run, so JSON files are compared as values (re-serialized with sorted keys); every
// other file byte for byte. Only the Swift toolchain is needed.
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 3 else {
  FileHandle.standardError.write(
    "usage: swift scripts/docs-same.swift <first site> <second site>\n".data(using: .utf8)!)
  exit(2)
}

func files(under root: String) -> Set<String> {
  var result = Set<String>()
  let enumerator = FileManager.default.enumerator(atPath: root)
  while let path = enumerator?.nextObject() as? String {
    var isDirectory: ObjCBool = false
    if FileManager.default.fileExists(atPath: root + "/" + path, isDirectory: &isDirectory), !isDirectory.boolValue {
      result.insert(path)
    }
  }
  return result
}

func canonical(_ data: Data, json: Bool) -> Data? {
  guard json else { return data }
  guard let object = try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed]) else { return nil }
  return try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .fragmentsAllowed])
}

let (first, second) = (arguments[1], arguments[2])
let firstFiles = files(under: first)
let secondFiles = files(under: second)
var problems: [String] = []
for path in firstFiles.subtracting(secondFiles).sorted() { problems.append("only in the first build: \(path)") }
for path in secondFiles.subtracting(firstFiles).sorted() { problems.append("only in the second build: \(path)") }
for path in firstFiles.intersection(secondFiles).sorted() {
  let json = path.hasSuffix(".json")
  guard let a = FileManager.default.contents(atPath: first + "/" + path),
    let b = FileManager.default.contents(atPath: second + "/" + path)
  else {
    problems.append("unreadable: \(path)")
    continue
  }
  let ca = canonical(a, json: json)
  if ca == nil || ca != canonical(b, json: json) { problems.append("differs: \(path)") }
}
let pages = secondFiles.filter { $0.hasPrefix("data/documentation/") && $0.hasSuffix(".json") }.count
if pages < 2 { problems.append("the second build has \(pages) page(s) of render JSON: the symbol pages are missing") }
if !problems.isEmpty {
  for problem in problems { FileHandle.standardError.write("docs-same: \(problem)\n".data(using: .utf8)!) }
  exit(1)
}
print("docs-same: both builds give the same site (\(secondFiles.count) files, \(pages) pages of render JSON)")
