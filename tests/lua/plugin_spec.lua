-- plugin/agent_bash.lua and doc/agent_bash.txt: startup cost, commands, mappings, help tags.
local t = ...

t.describe('startup', function()
  t.it('loads no Lua module', function()
    t.ok(vim.g.loaded_agent_bash)
    for name in pairs(package.loaded) do
      t.ok(not name:find('^agent_bash'), name .. ' was required at startup')
    end
  end)

  t.it('costs well under a millisecond and guards against double loading', function()
    local file = t.root .. '/plugin/agent_bash.lua'
    vim.cmd.source(file) -- guarded: nothing happens
    local best = math.huge
    for _ = 1, 5 do
      vim.g.loaded_agent_bash = nil
      local start = vim.uv.hrtime()
      vim.cmd.source(file)
      best = math.min(best, (vim.uv.hrtime() - start) / 1e6)
    end
    t.ok(best < 1, ('sourcing took %.3f ms'):format(best))
  end)

  t.it('defines the commands and <Plug> mappings, no global keys', function()
    for _, cmd in ipairs({ 'AgentBash', 'AgentBashTerm', 'AgentBashHistory', 'AgentBashCancel', 'AgentBashFocus', 'AgentBashToggle', 'AgentBashClose', 'AgentBashBuild' }) do
      t.eq(2, vim.fn.exists(':' .. cmd), cmd)
    end
    t.eq(true, vim.api.nvim_get_commands({})['AgentBash'].bang)
    t.eq(true, vim.api.nvim_get_commands({})['AgentBashTerm'].bang)
    for _, name in ipairs({ 'AgentBashPrompt', 'AgentBashHistory', 'AgentBashCancel', 'AgentBashFocus', 'AgentBashToggle', 'AgentBashClose' }) do
      t.ok(vim.fn.maparg('<Plug>(' .. name .. ')', 'n') ~= '', name)
    end
    for _, m in ipairs(vim.api.nvim_get_keymap('n')) do
      t.ok(not (m.desc or ''):find('^agent%-bash') or m.lhs:find('^<Plug>'), 'global key ' .. m.lhs)
    end
  end)

  t.it('reads artifact:// with a BufReadCmd', function()
    t.eq(1, #vim.api.nvim_get_autocmds({ event = 'BufReadCmd', pattern = 'artifact://*' }))
  end)
end)

t.describe('help', function()
  local doc = t.root .. '/doc/agent_bash.txt'

  t.it(':helptags succeeds without errors or duplicates', function()
    local dir = vim.fn.tempname()
    vim.fn.mkdir(dir, 'p')
    vim.fn.writefile(vim.fn.readfile(doc), dir .. '/agent_bash.txt')
    vim.cmd('helptags ' .. vim.fn.fnameescape(dir)) -- raises on E154 duplicate tags
    t.ok(#vim.fn.readfile(dir .. '/tags') > 50)
  end)

  t.it('every |link| resolves', function()
    local tags = {}
    for _, line in ipairs(vim.fn.readfile(vim.env.VIMRUNTIME .. '/doc/tags')) do
      tags[line:match('^[^\t]+')] = true
    end
    local text = table.concat(vim.fn.readfile(doc), '\n')
    for tag in text:gmatch('%*([^%s*|]+)%*') do
      tags[tag] = true
    end
    for ref in text:gmatch('|([^%s|]+)|') do
      t.ok(tags[ref], 'unknown help link |' .. ref .. '|')
    end
  end)

  t.it('documents every option, command, mapping and API function', function()
    local text = table.concat(vim.fn.readfile(doc), '\n')
    for key in pairs(require('agent_bash.config').defaults) do
      t.ok(text:find('*agent_bash-' .. key .. '*', 1, true), 'option ' .. key)
    end
    for _, key in ipairs({ 'bin', 'settings_file', 'border' }) do
      t.ok(text:find('*agent_bash-' .. key .. '*', 1, true), 'option ' .. key)
    end
    for name, value in pairs(require('agent_bash')) do
      local tag = type(value) == 'function' and ('*agent_bash.' .. name .. '()*') or ('*agent_bash.' .. name .. '*')
      t.ok(text:find(tag, 1, true), 'API ' .. name)
    end
    for cmd in pairs(vim.api.nvim_get_commands({})) do
      if cmd:find('^AgentBash') then
        t.ok(text:find('*:' .. cmd .. '*', 1, true), 'command ' .. cmd)
      end
    end
    for _, m in ipairs(vim.api.nvim_get_keymap('n')) do
      local plug = m.lhs:match('^<Plug>%(AgentBash.*%)$')
      if plug then
        t.ok(text:find('*' .. plug .. '*', 1, true), 'mapping ' .. plug)
      end
    end
  end)
end)
